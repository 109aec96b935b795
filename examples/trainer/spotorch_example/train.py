"""Example workload: a small numpy MLP trained by minibatch SGD, preemptible via spotorch_trainer.

    python -m spotorch_example.train [--total-steps N] [--step-sleep S] [--fail-at-step K] ...
    python examples/train.py ...          (the same, from a source checkout)

Reads CSV shards from SPOTORCH_DATA_URI (or --data; local dir or gs:// prefix), checkpoints weights,
optimizer and RNG state every --checkpoint-every steps, resumes exactly (same data and seed give a
bit-identical model whether or not it was preempted), and writes model.npz and metrics.json to
SPOTORCH_MODEL_URI / AIP_MODEL_DIR (or --model-dir). Every option also reads an EXAMPLE_* variable.
Exit codes: 0 done, 143 preempted (final checkpoint written), 1 failed (e.g. --fail-at-step).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

_TRAINER = Path(__file__).resolve().parents[3] / "trainer"  # examples/trainer/spotorch_example/
if (_TRAINER / "spotorch_trainer" / "__init__.py").is_file() and str(_TRAINER) not in sys.path:
    sys.path.insert(0, str(_TRAINER))  # a source checkout: use the helper next to this file

from spotorch_example.serving import SERVING_FILE, joblib_bytes, sklearn_model  # noqa: E402
from spotorch_trainer import (  # noqa: E402
    Run,
    SnapshotObject,
    contract,
    join,
    list_files,
    read_bytes,
    snapshot_objects,
    write_bytes,
)
from spotorch_trainer.evaluation import held_out, p95_ms, report_evaluation  # noqa: E402
from spotorch_trainer.latency import serving_metrics  # noqa: E402

log = logging.getLogger("example")

MODEL_FILE = "model.npz"
METRICS_FILE = "metrics.json"
LABEL = "label"

Params = dict[str, np.ndarray]


class DeliberateFailure(RuntimeError):
    """Raised by --fail-at-step: the 'user error' scenario (exit code 1)."""


@dataclass(frozen=True)
class Config:
    """Hyper-parameters and run-time knobs (args override EXAMPLE_* variables)."""

    data: str | None = None
    model_dir: str | None = None
    total_steps: int = 2000
    batch_size: int = 64
    hidden: int = 32
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    input_noise: float = 0.05
    holdout: float = 0.2
    seed: int = 0
    checkpoint_every: int = 100
    keep: int = 3
    step_sleep: float = 0.0
    fail_at_step: int | None = None
    progress_interval: float = 5.0
    working_memory_mb: int = 0
    eval_every: int = 0


# Option name -> (type, help). The EXAMPLE_* variable is the upper-cased name.
_OPTIONS: Mapping[str, tuple[type, str]] = {
    "data": (str, "data snapshot: dir or gs:// prefix of CSV or Parquet shards (default $SPOTORCH_DATA_URI)"),
    "model_dir": (str, "where model.npz and metrics.json go (default $SPOTORCH_MODEL_URI, "
                       "then $AIP_MODEL_DIR)"),
    "total_steps": (int, "SGD steps in all"),
    "batch_size": (int, "minibatch size"),
    "hidden": (int, "hidden units"),
    "lr": (float, "peak learning rate (cosine decay)"),
    "momentum": (float, "SGD momentum"),
    "weight_decay": (float, "L2 weight decay"),
    "input_noise": (float, "std of Gaussian noise added to inputs (augmentation)"),
    "holdout": (float, "fraction of rows held out for evaluation"),
    "seed": (int, "seed of the split, the initial weights and the batches"),
    "checkpoint_every": (int, "checkpoint every N steps (0: only on SIGTERM)"),
    "keep": (int, "complete checkpoints to keep"),
    "step_sleep": (float, "seconds to sleep per step, to make a demo run last"),
    "fail_at_step": (int, "fail with exit code 1 at this step (user-error demo)"),
    "progress_interval": (float, "seconds between progress events"),
    "working_memory_mb": (int, "MiB held from the first step on: stands in for a bigger model's "
                               "activations (out-of-memory probes)"),
    "eval_every": (int, "evaluate on the held-out rows every N steps too (0: only at the end); "
                        "a Vizier sweep measures its trials by it"),
}


def parse_config(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Defaults < EXAMPLE_* variables < a sweep trial's parameters < command-line arguments."""
    from spotorch_trainer import params

    env = os.environ if environ is None else environ
    trial = params(env)  # SPOTORCH_PARAMS: e.g. {"lr": 0.05} on a trial of a sweep
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    defaults = Config()
    for name, (kind, text) in _OPTIONS.items():
        raw = str(trial[name]) if name in trial else env.get(f"EXAMPLE_{name.upper()}", "")
        if name == "seed" and raw == "":  # no seed of its own: the run's (a rerun gets the same)
            raw = env.get(contract.ENV_SEED, "")
        default = kind(raw) if raw != "" else getattr(defaults, name)
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default, help=text)
    return Config(**vars(parser.parse_args(argv)))


# -- data -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Dataset:
    """Standardised train/test split of the snapshot, and a fingerprint of the raw bytes."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    mean: np.ndarray  # of the raw training features: serving standardises inputs with these
    std: np.ndarray
    classes: int
    sha256: str


def csv_shards(uri: str, pinned: list[SnapshotObject] | None = None) -> list[tuple[str, bytes]]:
    """(name, bytes) of every *.csv under uri in name order. pinned: the run's snapshot objects
    (spotorch_trainer.snapshot_objects), read at their recorded generations, so an object
    overwritten since the run was created (or rerun) is read as it was."""
    if pinned:
        prefix = uri.rstrip("/") + "/"
        chosen = [o for o in pinned if o.name.endswith(".csv")
                  and (o.uri.startswith(prefix) or o.uri == uri)]
        return [(o.uri.removeprefix(prefix).rsplit("/", 1)[-1] if o.uri == uri
                 else o.uri.removeprefix(prefix), o.read()) for o in chosen]
    return [(n, read_bytes(join(uri, n))) for n in list_files(uri) if n.endswith(".csv")]


def load_csv_shards(uri: str, pinned: list[SnapshotObject] | None = None,
                    ) -> tuple[np.ndarray, np.ndarray, str]:
    """Every *.csv under uri in name order: features, labels and a sha256 of the bytes read."""
    shards = csv_shards(uri, pinned)
    if not shards:
        raise FileNotFoundError(f"no .csv files under {uri}")
    digest = hashlib.sha256()
    xs, ys = [], []
    for name, raw in shards:
        digest.update(name.encode() + b"\0" + raw)
        header = raw.split(b"\n", 1)[0].decode().strip().split(",")
        table = np.loadtxt(io.BytesIO(raw), delimiter=",", skiprows=1, ndmin=2)
        label = header.index(LABEL)
        ys.append(table[:, label].astype(np.int64))
        xs.append(np.delete(table, label, axis=1))
    return np.concatenate(xs), np.concatenate(ys), digest.hexdigest()


def parquet_shards(uri: str, pinned: list[SnapshotObject] | None = None
                   ) -> list[tuple[str, bytes]]:
    """(name, bytes) of every *.parquet under uri in name order; pinned: as csv_shards."""
    from spotorch_trainer import parquet_files

    if pinned:
        prefix = uri.rstrip("/") + "/"
        return [(o.uri.removeprefix(prefix), o.read()) for o in pinned
                if o.name.endswith(".parquet") and o.uri.startswith(prefix)]
    return [(n, read_bytes(join(uri, n))) for n in parquet_files(uri)]


def load_parquet_shards(uri: str, pinned: list[SnapshotObject] | None = None,
                        ) -> tuple[np.ndarray, np.ndarray, str]:
    """Every *.parquet under uri (a BigQuery snapshot's export) in name order: the numeric
    columns but the label as features, the label, and a sha256 of the bytes read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shards = parquet_shards(uri, pinned)
    if not shards:
        raise FileNotFoundError(f"no .csv or .parquet files under {uri}")
    digest = hashlib.sha256()
    for name, raw in shards:
        digest.update(name.encode() + b"\0" + raw)
    table = pa.concat_tables([pq.read_table(io.BytesIO(raw)) for _, raw in shards])
    features = [c for c in table.column_names if c != LABEL]
    x = np.column_stack([table.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
                         for c in features])
    y = table.column(LABEL).to_numpy(zero_copy_only=False).astype(np.int64)
    return x, y, digest.hexdigest()


def load_shards(uri: str, pinned: list[SnapshotObject] | None = None,
                ) -> tuple[np.ndarray, np.ndarray, str]:
    """The snapshot's CSV files, or its Parquet files when it has no CSV (a BigQuery export);
    pinned: the run's snapshot objects at their generations (csv_shards)."""
    names = [o.name for o in pinned] if pinned else list_files(uri)
    if any(n.endswith(".csv") for n in names):
        return load_csv_shards(uri, pinned)
    return load_parquet_shards(uri, pinned)


def split(x: np.ndarray, y: np.ndarray, holdout: float, seed: int, sha: str) -> Dataset:
    """A seeded train/test split, standardised with the training set's statistics."""
    order = np.random.default_rng([seed, 1]).permutation(len(y))
    n_test = max(1, int(len(y) * holdout))
    test, train = order[:n_test], order[n_test:]
    mean = x[train].mean(axis=0)
    std = x[train].std(axis=0) + 1e-8
    return Dataset((x[train] - mean) / std, y[train], (x[test] - mean) / std, y[test], mean, std,
                   int(y.max()) + 1, sha)


# -- model ----------------------------------------------------------------------------------------

def init_params(features: int, hidden: int, classes: int, seed: int) -> Params:
    rng = np.random.default_rng([seed, 2])
    return {"w1": rng.normal(0.0, features ** -0.5, (features, hidden)), "b1": np.zeros(hidden),
            "w2": rng.normal(0.0, hidden ** -0.5, (hidden, classes)), "b2": np.zeros(classes)}


def forward(p: Params, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hidden activations and class probabilities."""
    h = np.tanh(x @ p["w1"] + p["b1"])
    logits = h @ p["w2"] + p["b2"]
    logits -= logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return h, e / e.sum(axis=1, keepdims=True)


def loss_and_accuracy(p: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    _, probs = forward(p, x)
    loss = -np.log(probs[np.arange(len(y)), y] + 1e-12).mean()
    return float(loss), float((probs.argmax(axis=1) == y).mean())


def gradients(p: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, Params]:
    """Cross-entropy of the batch and its gradients (backprop by hand)."""
    h, probs = forward(p, x)
    n = len(y)
    loss = float(-np.log(probs[np.arange(n), y] + 1e-12).mean())
    d_logits = probs.copy()
    d_logits[np.arange(n), y] -= 1.0
    d_logits /= n
    d_h = (d_logits @ p["w2"].T) * (1.0 - h * h)
    return loss, {"w1": x.T @ d_h, "b1": d_h.sum(axis=0),
                  "w2": h.T @ d_logits, "b2": d_logits.sum(axis=0)}


def learning_rate(cfg: Config, step: int) -> float:
    """Cosine decay from cfg.lr to zero: a pure function of the step, so resuming needs no state."""
    return cfg.lr * 0.5 * (1.0 + float(np.cos(np.pi * step / cfg.total_steps)))


# Knobs that do not change the trained model; everything else must match to resume a checkpoint.
_RUNTIME_ONLY = frozenset({"data", "model_dir", "checkpoint_every", "keep", "step_sleep",
                           "fail_at_step", "progress_interval"})


def fingerprint(cfg: Config, data: Dataset) -> str:
    """What determines the final model: the data and every hyper-parameter."""
    shaping = {k: v for k, v in asdict(cfg).items() if k not in _RUNTIME_ONLY}
    return hashlib.sha256(json.dumps([shaping, data.sha256], sort_keys=True).encode()).hexdigest()


def fresh_state(cfg: Config, data: Dataset) -> dict[str, Any]:
    """Everything that changes while training: weights, momentum buffers, the batch RNG."""
    params = init_params(data.x_train.shape[1], cfg.hidden, data.classes, cfg.seed)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([cfg.seed, 3])))
    return {"params": params, "velocity": {k: np.zeros_like(v) for k, v in params.items()},
            "rng": rng.bit_generator.state, "fingerprint": fingerprint(cfg, data)}


def train_step(cfg: Config, state: dict[str, Any], rng: np.random.Generator, data: Dataset,
               step: int) -> float:
    """One SGD-with-momentum step on a sampled, noised minibatch; updates state in place."""
    idx = rng.integers(0, len(data.y_train), size=cfg.batch_size)
    x = data.x_train[idx] + rng.normal(0.0, cfg.input_noise, (cfg.batch_size,
                                                              data.x_train.shape[1]))
    loss, grads = gradients(state["params"], x, data.y_train[idx])
    lr = learning_rate(cfg, step)
    for name, param in state["params"].items():
        v = state["velocity"][name]
        v *= cfg.momentum
        v += grads[name] + cfg.weight_decay * param
        param -= lr * v
    return loss


# -- outputs --------------------------------------------------------------------------------------

def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **dict(arrays))  # type: ignore[arg-type]
    return buf.getvalue()


def evaluate(cfg: Config, params: Params, data: Dataset) -> dict[str, float]:
    test_loss, test_acc = loss_and_accuracy(params, data.x_test, data.y_test)
    train_loss, train_acc = loss_and_accuracy(params, data.x_train, data.y_train)
    return {"test_accuracy": test_acc, "test_loss": test_loss, "train_accuracy": train_acc,
            "train_loss": train_loss}


def evaluate_held_out(run: Run, served: Any) -> dict[str, float]:
    """Score the served model on the held-out folder spotorch names (SPOTORCH_EVAL_DATA_URI) and
    report it as eval_* (with its p95 predict latency); nothing when none is named."""
    spec = held_out()
    if spec is None:
        return {}
    if spec.data_uri is None:
        raise SystemExit("this example evaluates on model.evaluation.data_uri only (its rows "
                         "have no key column to split on)")
    x, y, _ = load_shards(spec.data_uri)
    probs = served.predict_proba(x)
    accuracy = float((served.classes_[probs.argmax(axis=1)] == y).mean())
    loss = float(-np.log(probs[np.arange(len(y)), np.searchsorted(served.classes_, y)]
                         + 1e-12).mean())
    latency = p95_ms(lambda row: served.predict(row.reshape(1, -1)), list(x[:50]))
    log.info("held-out %s: accuracy %.3f, p95 predict %.2f ms", spec.data_uri, accuracy, latency)
    return report_evaluation(run, {"accuracy": accuracy, "loss": loss}, latency_p95_ms=latency)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with Run(total_steps=cfg.total_steps, checkpoint_every=cfg.checkpoint_every or None,
             keep_last=cfg.keep, progress_interval_s=cfg.progress_interval,
             samples_per_step=cfg.batch_size) as run:
        data_uri = cfg.data or run.env.data_uri
        if not data_uri:
            raise SystemExit("no data: set SPOTORCH_DATA_URI or pass --data")
        model_dir = cfg.model_dir or run.env.model_uri
        # The run's own snapshot: its objects at their recorded generations (not --data's).
        pinned = snapshot_objects(run.env.inputs_uri or "") if not cfg.data else None
        x, y, sha = load_shards(data_uri, pinned)
        data = split(x, y, cfg.holdout, cfg.seed, sha)
        log.info("run %s attempt %d: %d train / %d test rows, %d features, %d classes from %s",
                 run.env.run_id, run.env.attempt, len(data.y_train), len(data.y_test),
                 data.x_train.shape[1], data.classes, data_uri)

        ckpt = run.restore()
        state = ckpt.state if ckpt else fresh_state(cfg, data)
        if ckpt and state.get("fingerprint") != fingerprint(cfg, data):
            # Resuming would silently train a different model: refuse (exit 1, a user error).
            raise SystemExit(f"{ckpt.uri} was taken with other data or hyper-parameters; "
                             "point SPOTORCH_CHECKPOINT_URI elsewhere or delete it")
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = state["rng"]

        working: list[np.ndarray] = []
        for step in run.steps():
            if cfg.working_memory_mb and not working:
                working.append(np.ones(cfg.working_memory_mb * 2**17))  # 8-byte floats
            if cfg.fail_at_step is not None and step >= cfg.fail_at_step:
                raise DeliberateFailure(f"failing at step {step} as asked (--fail-at-step)")
            if cfg.step_sleep:
                time.sleep(cfg.step_sleep)  # stands in for a heavier step; SIGTERM lands here
            loss = train_step(cfg, state, rng, data, step)
            run.log_metrics(loss=loss)
            if cfg.eval_every and (step + 1) % cfg.eval_every == 0:
                run.log_metrics(**evaluate(cfg, state["params"], data))
            if run.checkpoint_due():
                state["rng"] = rng.bit_generator.state
                run.checkpoint(state)

        metrics = evaluate(cfg, state["params"], data)
        blob = npz_bytes({**state["params"], "x_mean": data.mean, "x_std": data.std})
        write_bytes(join(model_dir, MODEL_FILE), blob)
        # issue 37: the same model as Vertex's prebuilt scikit-learn container loads it, and its
        # score on the pipeline's held-out data (model.evaluation) for the promotion gate
        served = sklearn_model(state["params"], data.mean, data.std, data.classes)
        write_bytes(join(model_dir, SERVING_FILE), joblib_bytes(served))
        evaluate_held_out(run, served)
        # What serving will see: latency per request on the held-out rows, and the model's size.
        metrics.update(serving_metrics(lambda rows: forward(state["params"], np.asarray(rows)),
                                       data.x_test, model_bytes=len(blob)))
        summary = {**metrics, "steps": cfg.total_steps, "n_train": len(data.y_train),
                   "n_test": len(data.y_test), "data_sha256": data.sha256, "config": asdict(cfg)}
        write_bytes(join(model_dir, METRICS_FILE),
                    json.dumps(summary, indent=2, sort_keys=True).encode())
        run.log_metrics(**metrics)
        log.info("done: test accuracy %.3f, model in %s", metrics["test_accuracy"], model_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
