"""The shared record of Spot behaviour per region and machine shape, across all runs (issue 18).

Every run sees Spot only through its own attempts and probes; together they see much more. When
an attempt on Spot ends or a probe answers, what it observed (time watched, time Spot had
capacity, a preemption) is added to documents per (region, shape) in `spot_regions`, in
hourly buckets, keeping the last `TTL_S`. A run's next Spot attempt goes to the best region of
its pipeline's list by policy.rank_regions over those records, instead of the fixed order
(stockouts still move down the ranked list). A document nobody wrote for a TTL is deleted by
Firestore's TTL policy on `expires_at` (deploy/firestore.tf).

Costs: one blind write (server-side increments) per ended Spot attempt or answered probe, on one
of SHARDS documents of the day (so a mass preemption does not load one document); ranking (and
the hardware choice's outlook) reads 2 x SHARDS documents per region and shape, cached per
instance for `CACHE_S`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from spotorch.core.model import FailureClass, Run
from spotorch.core.pipeline import Capacity, Pipeline
from spotorch.core.policy import RegionRecord, rank_regions
from spotorch.core.shapes import run_pipeline
from spotorch.ports.store import AddTo, DocumentStore
from spotorch.settings import COLLECTION_SPOT_REGIONS

BUCKET_S = 3600.0  # observations are summed per hour
TTL_S = 24 * 3600.0  # and kept this long (the simulator's region_ttl_s)
CACHE_S = 60.0  # an instance re-reads the record of a shape at most this often
PROBE_YES_S = 300.0  # a probe's yes counts as this long of capacity seen (about one tick)


@dataclass(frozen=True)
class Seen:
    """What one attempt or probe observed of Spot in one region."""

    region: str
    observed_s: float
    available_s: float
    preemptions: int = 0


def shape_key(pipeline: Pipeline, run: Run) -> str:
    """The run's chief machine shape, as the record is keyed: machine type plus accelerators."""
    return shape_of(pipeline, run.hardware, run.health.machine_type)


def shape_of(pipeline: Pipeline, hardware: Mapping[str, Any] | None,
             machine_type: str | None = None) -> str:
    """The chief shape of the pipeline on a hardware choice (and out-of-memory machine)."""
    pools = run_pipeline(pipeline, hardware).job.worker_pools
    if not pools:
        return "default"
    chief = pools[0]
    machine = machine_type or chief.machine_type
    accel = f"+{chief.accelerator_type}x{chief.accelerator_count}" \
        if chief.accelerator_type and chief.accelerator_count else ""
    return f"{machine}{accel}"


def seen_between(old: Run | None, new: Run, now: float) -> list[Seen]:
    """What became known from `old` to `new`: Spot attempts that ended, probes that answered."""
    out: list[Seen] = []
    for attempt in new.attempts:
        before = old.attempt(attempt.number) if old is not None else None
        if attempt.capacity is not Capacity.SPOT or attempt.live or \
                (before is not None and not before.live):
            continue
        end = attempt.ended_at if attempt.ended_at is not None else now
        watched_from = attempt.queued_since or attempt.created_at
        ran = max(end - attempt.started_at, 0.0) if attempt.started_at is not None else 0.0
        out.append(Seen(attempt.region, max(end - watched_from, 0.0), ran,
                        int(attempt.failure is FailureClass.PREEMPTED)))
    for probe in new.probes:
        before_probe = old.probe(probe.number) if old is not None else None
        if probe.found is None or (before_probe is not None and before_probe.found is not None):
            continue
        waited_to = (probe.started_at if probe.found else probe.ended_at) or now
        waited = max(waited_to - (probe.queued_since or probe.created_at), 0.0)
        yes = PROBE_YES_S if probe.found else 0.0
        out.append(Seen(probe.region, waited + yes, yes))
    return out


# An observation is one blind write (ports.AddTo: server-side increments, no read, no
# precondition) in the commit of the run change that made it, so writers never conflict.
# Firestore still sustains only about one write per second per document, and a mass preemption
# ends many Spot attempts of one region and shape at once: the record is spread over SHARDS
# documents (by the run's reconcile bucket), and over one document per day, so that no document
# grows without end; a reader sums them.
SHARDS = 8
DAY_S = 86400.0
_COUNTERS = ("observed", "available", "preemptions")  # maps: hour -> sum


def doc_key(region: str, shape: str, shard: int, day: int) -> str:
    """The document of one region, shape, shard and day of the record (no slashes in ids)."""
    return f"{region}__{shape}__{day}__{shard % SHARDS}".replace("/", "_")


def _days(now: float, ttl_s: float) -> range:
    """The days a record within the TTL may be kept in."""
    return range(int((now - ttl_s) // DAY_S), int(now // DAY_S) + 1)


def _buckets(doc: Mapping[str, Any] | None, now: float, ttl_s: float) -> list[list[float]]:
    """The document's hourly buckets within the TTL: [observed_s, available_s, preemptions]."""
    found = doc or {}
    maps: list[Mapping[str, Any]] = []
    for name in _COUNTERS:
        value = found.get(name)
        maps.append(value if isinstance(value, Mapping) else {})
    kept = []
    for hour in maps[0]:
        try:
            start = float(hour) * BUCKET_S
            triple = [float(m.get(hour, 0.0)) for m in maps]
        except (TypeError, ValueError):
            continue  # a damaged bucket is dropped, not trusted
        if start + BUCKET_S > now - ttl_s:
            kept.append(triple)
    return kept


@dataclass
class SpotRecord:
    """Reads and writes the shared record; one per process (its ranking cache is per instance)."""

    ttl_s: float = TTL_S
    cache_s: float = CACHE_S
    _cache: dict[tuple[str, tuple[str, ...]], tuple[float, tuple[RegionRecord, ...]]] = field(
        default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def additions(self, shape: str, seen: Sequence[Seen], now: float, *,
                  shard: int) -> list[AddTo]:
        """The blind writes that add these observations to the given shard, to commit with the
        run change that made them (RunStore.save)."""
        hour, day = str(int(now // BUCKET_S)), int(now // DAY_S)
        # A timestamp: Firestore's TTL policy ignores a number.
        expires = datetime.fromtimestamp(now + self.ttl_s + DAY_S, UTC)
        return [AddTo(COLLECTION_SPOT_REGIONS, doc_key(one.region, shape, shard, day),
                      {"observed": {hour: one.observed_s}, "available": {hour: one.available_s},
                       "preemptions": {hour: float(one.preemptions)}},
                      {"region": one.region, "shape": shape, "updated_at": now,
                       "expires_at": expires})
                for one in seen if one.observed_s > 0]

    def records(self, docs: DocumentStore, shape: str, regions: Sequence[str],
                now: float) -> list[RegionRecord]:
        """Each region's record within the TTL (empty where nothing was observed); read at
        most once per `cache_s` per instance."""
        key = (shape, tuple(regions))
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and now - cached[0] < self.cache_s:
            return list(cached[1])
        out = []
        for region in regions:
            totals = [0.0, 0.0, 0.0]
            for day in _days(now, self.ttl_s):
                for shard in range(SHARDS):
                    doc, _ = docs.get(COLLECTION_SPOT_REGIONS, doc_key(region, shape, shard, day))
                    for values in _buckets(doc, now, self.ttl_s):
                        totals = [a + b for a, b in zip(totals, values, strict=True)]
            out.append(RegionRecord(observed_s=totals[0], available_s=min(totals[1], totals[0]),
                                    preemptions=int(totals[2])))
        with self._lock:
            self._cache[key] = (now, tuple(out))
        return out

    def order(self, docs: DocumentStore, shape: str, regions: Sequence[str],
              now: float) -> tuple[str, ...]:
        """The regions best first for the next Spot attempt of this shape."""
        return tuple(regions[i] for i in rank_regions(self.records(docs, shape, regions, now)))

    def forget(self) -> None:
        """Drop the cache (tests; a new instance starts empty anyway)."""
        with self._lock:
            self._cache.clear()
