"""A local stand-in for Vertex AI's prebuilt prediction container (issue 37), one process per
deployed model: it loads the version's artifact the way the prebuilt container does and answers
`POST /predict` with `{"instances": [...]}` -> `{"predictions": [...]}`.

What the prebuilt containers load (FACTS.md): scikit-learn `model.joblib` or `model.pkl`;
XGBoost `model.bst`, `model.joblib` or `model.pkl`, from the version's artifact_uri folder
(gs:// through the stack's fake GCS, or a local folder). Instances are rows of features; the
answer is `model.predict(instances)` as a list (the scikit-learn container's default). TensorFlow
and PyTorch artifacts are not served locally: the process exits saying so.

    python -m spotorch.local._prediction_server --artifact-uri URI --framework sklearn

Prints `READY <port>` on stdout once the model is loaded (127.0.0.1, a free port).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import pickle
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FILES = {"sklearn": ("model.joblib", "model.pkl"),
         "xgboost": ("model.bst", "model.joblib", "model.pkl")}


def load(artifact_uri: str, framework: str) -> Any:
    """The model as the prebuilt container loads it; ValueError saying why it cannot."""
    from spotorch_trainer.storage import join, list_files, read_bytes

    wanted = FILES.get(framework)
    if wanted is None:
        raise ValueError(f"the local prediction server does not serve {framework} models")
    present = set(list_files(artifact_uri))
    name = next((n for n in wanted if n in present), None)
    if name is None:
        raise ValueError(f"{artifact_uri} holds no {' or '.join(wanted)}")
    raw = read_bytes(join(artifact_uri, name))
    if name == "model.bst":
        import xgboost

        booster = xgboost.Booster()
        booster.load_model(bytearray(raw))
        return booster
    if name == "model.joblib":
        import joblib

        return joblib.load(io.BytesIO(raw))
    return pickle.loads(raw)


def predict(model: Any, instances: list[Any]) -> list[Any]:
    """model.predict(instances) as JSON values."""
    import numpy as np

    if type(model).__module__.startswith("xgboost"):
        import xgboost

        out = model.predict(xgboost.DMatrix(np.asarray(instances)))
    else:
        out = model.predict(np.asarray(instances))
    return [v.item() if hasattr(v, "item") else v for v in np.asarray(out).tolist()] \
        if not isinstance(out, list) else out


def serve(model: Any) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer(200, {"status": "ok"})

        def do_POST(self) -> None:
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                instances = body["instances"]
                if not isinstance(instances, list) or not instances:
                    raise ValueError("instances must be a non-empty list")
                self._answer(200, {"predictions": predict(model, instances)})
            except (ValueError, KeyError, TypeError) as exc:
                self._answer(400, {"error": f"{type(exc).__name__}: {exc}"})
            except Exception as exc:  # the model's own failure: a 500 as the container gives
                self._answer(500, {"error": f"{type(exc).__name__}: {exc}"})

    return ThreadingHTTPServer(("127.0.0.1", 0), Handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact-uri", required=True)
    parser.add_argument("--framework", required=True)
    args = parser.parse_args(argv)
    try:
        model = load(args.artifact_uri, args.framework)
    except Exception as exc:
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        return 1
    server = serve(model)
    print(f"READY {server.server_address[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
