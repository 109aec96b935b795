"""The Vertex request budget shared by every instance through the document store (issue 17):
one contract suite, one subclass per store (memory, the Firestore emulator)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from spotorch.adapters.gcp.vertex_budgets import RequestBudget, SharedRequestBudget
from spotorch.adapters.memory.twins import InMemoryDocumentStore
from spotorch.ports.budget import CRUD, QUOTA_WINDOW_S, SUBMIT
from spotorch.ports.jobs import LaunchError
from spotorch.ports.store import DocumentStore
from spotorch.settings import Settings

# Small quotas keep the emulator's share of the work small; share 1.0, blocks of a quarter.
QUOTAS = {CRUD: 10.0, SUBMIT: 2.0}
LEASE_S = 5.0
HORIZON_S = QUOTA_WINDOW_S + LEASE_S
T0 = 1_800_000_000.0


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class SharedBudgetContract:
    """What the shared budget guarantees on any DocumentStore; subclasses provide `docs`."""

    @pytest.fixture
    def docs(self) -> DocumentStore:
        raise NotImplementedError

    @pytest.fixture
    def collection(self) -> str:
        return f"budgets{uuid.uuid4().hex[:8]}"

    @pytest.fixture
    def make(self, docs: DocumentStore, collection: str) -> Callable[..., SharedRequestBudget]:
        def make(clock: Callable[[], float], quotas: dict[str, float] = QUOTAS,
                 **kwargs: Any) -> SharedRequestBudget:
            options: dict[str, Any] = {"share": 1.0, "lease_s": LEASE_S, "blocks_per_horizon": 4,
                                       "max_wait_s": 0.5, "collection": collection,
                                       "clock": clock, **kwargs}
            return SharedRequestBudget(docs, quotas, **options)
        return make

    def test_two_instances_across_threads_never_pass_more_than_the_window_limit(
            self, make: Callable[..., SharedRequestBudget]) -> None:
        clock = Clock(T0)  # time stands still: everything happens within one horizon
        budgets = [make(clock), make(clock)]
        assert budgets[0].limits == {CRUD: 10, SUBMIT: 2} and budgets[0].blocks[CRUD] == 3
        passed: list[int] = []
        refusals: list[LaunchError] = []
        lock = threading.Lock()

        def worker(budget: SharedRequestBudget) -> None:
            for _ in range(100):  # until refused (the budget is used up); 100: a bug, not a hang
                try:
                    budget.take("us-central1", (CRUD,))
                except LaunchError as exc:
                    with lock:
                        refusals.append(exc)
                    return
                with lock:
                    passed.append(id(budget))

        threads = [threading.Thread(target=worker, args=(b,), daemon=True)
                   for b in budgets for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        # Exactly the limit: no more, and no token lost while another instance still asked.
        assert len(passed) == 10
        assert len(refusals) == len(threads)
        assert all(e.code == "RESOURCE_EXHAUSTED" and not e.permanent for e in refusals)

    def test_a_launch_refused_for_its_submission_spends_no_crud_token(
            self, make: Callable[..., SharedRequestBudget]) -> None:
        clock = Clock(T0)
        a, b = make(clock), make(clock)
        a.take("r", (CRUD, SUBMIT))
        b.take("r", (CRUD, SUBMIT))  # the two submissions of the minute, one each
        with pytest.raises(LaunchError) as err:
            a.take("r", (CRUD, SUBMIT))
        assert err.value.code == "RESOURCE_EXHAUSTED" and not err.value.permanent
        taken = 2
        for budget in (a, b):  # the CRUD tokens left: 10 - 2, all still there
            while True:
                try:
                    budget.take("r", (CRUD,))
                except LaunchError:
                    break
                taken += 1
        assert taken == 10

    def test_regions_have_budgets_of_their_own(
            self, make: Callable[..., SharedRequestBudget]) -> None:
        clock = Clock(T0)
        a, b = make(clock), make(clock)
        for budget in (a, b):
            budget.take("r1", (SUBMIT,))
        with pytest.raises(LaunchError):
            a.take("r1", (SUBMIT,))
        a.take("r2", (SUBMIT,))

    def test_tokens_come_back_when_their_grant_leaves_the_horizon(
            self, make: Callable[..., SharedRequestBudget]) -> None:
        clock = Clock(T0)
        slept: list[float] = []

        def sleep(seconds: float) -> None:
            slept.append(seconds)
            clock.t += seconds
        a = make(clock, sleep=sleep, max_wait_s=3.0)
        a.take("r", (SUBMIT,))
        a.take("r", (SUBMIT,))
        with pytest.raises(LaunchError):  # 65 s until the first grant leaves: past max_wait_s
            a.take("r", (SUBMIT,))
        assert slept == []
        clock.t = T0 + HORIZON_S - 2.0
        a.take("r", (SUBMIT,))  # waits the 2 s for the first grant to leave
        assert slept == [pytest.approx(2.0)] and clock.t >= T0 + HORIZON_S
        clock.t = T0 + 2 * HORIZON_S - 10.0
        a.take("r", (SUBMIT,), max_wait_s=HORIZON_S)  # a caller that may wait longer (a listing)

    def test_leased_tokens_lapse_unspent(self, make: Callable[..., SharedRequestBudget]) -> None:
        clock = Clock(T0)
        a, b = make(clock), make(clock)
        a.take("r", (CRUD,))  # a's first lease: a quarter block, 1 token at least
        a.take("r", (CRUD,))  # it spent its lease: the next is twice as big, 2
        clock.t += LEASE_S + 0.1
        a.take("r", (CRUD,))  # the 1 left lapsed: a new lease of 2 (twice what it spent)
        assert a.leases_taken == 3
        taken = 0
        for budget in (b, a):
            while True:
                try:
                    budget.take("r", (CRUD,))
                except LaunchError:
                    break
                taken += 1
        assert taken == 10 - 1 - 2 - 2 + 1  # what is left after a's leases, plus a's 1 in hand

    def test_a_grant_counts_until_its_last_token_can_no_longer_be_spent(
            self, make: Callable[..., SharedRequestBudget]) -> None:
        clock = Clock(T0)
        a, b = make(clock, max_wait_s=0.0), make(clock, max_wait_s=0.0)
        a.take("r", (CRUD,))
        a.take("r", (CRUD,))  # a's two leases at T0: 1, then 2 (1 left)
        with pytest.raises(LaunchError):
            while True:
                b.take("r", (CRUD,))  # b the other 7
        clock.t = T0 + LEASE_S - 0.1
        a.take("r", (CRUD,))  # a's last, spent late but within its lease
        clock.t = T0 + QUOTA_WINDOW_S + 1.0
        # A minute after the grants, but the minute from a's late call has not passed: a grant
        # now could put 11 calls in [T0 + 4.9, T0 + 64.9].
        with pytest.raises(LaunchError):
            b.take("r", (CRUD,))
        clock.t = T0 + HORIZON_S + 0.1
        b.take("r", (CRUD,))

    def test_no_sliding_minute_sees_more_than_the_quota(
            self, make: Callable[..., SharedRequestBudget]) -> None:
        clock = Clock(T0 + 3.0)  # windows do not start on the quota's minute
        quotas = {CRUD: 600.0, SUBMIT: 12.0}
        budgets = [make(clock, quotas, max_wait_s=0.0), make(clock, quotas, max_wait_s=0.0)]
        passed: list[float] = []
        for _ in range(int(3 * QUOTA_WINDOW_S)):  # three minutes, each instance greedy every second
            for budget in budgets:
                for _ in range(1):  # one a second: a block is spent over seconds
                    try:
                        budget.take("r", (SUBMIT,))
                    except LaunchError:
                        break
                    passed.append(clock.t)
            clock.t += 1.0
        busiest = max(sum(1 for t in passed if start <= t < start + QUOTA_WINDOW_S)
                      for start in passed)
        assert busiest <= quotas[SUBMIT]
        assert len(passed) >= 3 * 12 * QUOTA_WINDOW_S / HORIZON_S - 12  # and it does let them through


class Interleaving(InMemoryDocumentStore):
    """The in-memory store with a network's pause after each read, so racing leases interleave
    between their read and their conditional write as they do on Firestore."""

    def get(self, collection: str, key: str) -> tuple[dict[str, Any] | None, Any]:
        found = super().get(collection, key)
        time.sleep(0.001)
        return found


class TestInMemorySharedBudget(SharedBudgetContract):
    @pytest.fixture
    def docs(self) -> DocumentStore:
        return Interleaving()


@pytest.mark.emulator
class TestFirestoreSharedBudget(SharedBudgetContract):
    @pytest.fixture
    def docs(self, emulators: Any) -> DocumentStore:
        from spotorch.adapters.gcp.firestore import FirestoreDocumentStore

        return FirestoreDocumentStore(project=emulators.project)


class Unreachable:
    """A document store that is down (every call fails as Firestore's client would)."""

    def __init__(self) -> None:
        self.calls = 0

    def get(self, collection: str, key: str) -> Any:
        self.calls += 1
        raise ConnectionError("firestore unavailable (simulated)")

    def put(self, collection: str, key: str, data: Any, version: Any, adds: Any = ()) -> Any:
        self.calls += 1
        raise ConnectionError("firestore unavailable (simulated)")

    def query(self, collection: str, field_name: str, value: Any) -> Any:
        raise ConnectionError("firestore unavailable (simulated)")


def test_an_unreachable_store_falls_back_to_the_conservative_instance_budget() -> None:
    clock = Clock(T0)
    store = Unreachable()
    fallback = RequestBudget({CRUD: 3.0}, max_wait_s=0.0, clock=clock)
    budget = SharedRequestBudget(store, QUOTAS, share=1.0, fallback=fallback,
                                 retry_store_after_s=30.0, clock=clock)
    for _ in range(3):
        budget.take("r", (CRUD,))  # served at once by the fallback, no waiting on the store
    with pytest.raises(LaunchError) as err:  # the fallback's own limit holds
        budget.take("r", (CRUD,))
    assert err.value.code == "RESOURCE_EXHAUSTED" and not err.value.permanent
    assert store.calls == 1 and budget.fallbacks == 4  # the store is not asked again at once
    clock.t += 31.0
    with pytest.raises(LaunchError):
        budget.take("r", (CRUD,))  # tried again after retry_store_after_s (still down)
    assert store.calls == 2


def test_the_default_fallback_is_a_tenth_of_the_quota() -> None:
    budget = SharedRequestBudget(InMemoryDocumentStore())
    assert isinstance(budget.fallback, RequestBudget)
    assert budget.fallback.per_minute == {CRUD: pytest.approx(54.0), SUBMIT: pytest.approx(5.4)}
    assert budget.limits == {CRUD: 540, SUBMIT: 54}  # 90% of Vertex's quotas
    assert budget.blocks == {CRUD: 34, SUBMIT: 4} and budget.horizon_s == 65.0  # the most a lease takes


def test_the_setting_chooses_the_shared_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env({"SPOTORCH_SHARED_BUDGET": "1"}).shared_budget
    assert not Settings.from_env({}).shared_budget
    from spotorch.entrypoints import wiring

    monkeypatch.setattr("spotorch.spec.compiled.function_pipelines", lambda path: ())
    shared = wiring.production_deps(Settings(project="p", shared_budget=True)).launcher
    own = wiring.production_deps(Settings(project="p")).launcher
    assert isinstance(getattr(shared, "budget", None), SharedRequestBudget)
    assert isinstance(getattr(own, "budget", None), RequestBudget)


class CountingJobs:
    """A JobServiceClient double with no jobs: counts creates, lists nothing."""

    def __init__(self) -> None:
        self.created = 0

    def create_custom_job(self, *, parent: str, custom_job: Any, timeout: float) -> Any:
        from google.cloud import aiplatform_v1 as v1

        self.created += 1
        return v1.CustomJob(name=f"{parent}/customJobs/{self.created}")

    def list_custom_jobs(self, *, request: Any, timeout: float) -> list[Any]:
        return []


def test_the_launcher_takes_every_call_from_the_shared_budget() -> None:
    from spotorch.adapters.gcp.vertex import LIST_PAGE_WAIT_S, VertexJobLauncher
    from spotorch.core.pipeline import Capacity, JobTemplate, WorkerPool
    from spotorch.ports.jobs import LaunchSpec

    clock = Clock(T0)

    def sleep(seconds: float) -> None:
        clock.t += seconds
    budget = SharedRequestBudget(InMemoryDocumentStore(), {CRUD: 4.0, SUBMIT: 1.0}, share=1.0,
                                 blocks_per_horizon=4, max_wait_s=0.0, clock=clock, sleep=sleep)
    jobs = CountingJobs()
    launcher = VertexJobLauncher("p", client_factory=lambda region: jobs, budget=budget)

    def spec(run_id: str) -> LaunchSpec:
        return LaunchSpec(run_id=run_id, pipeline="p", attempt=1, capacity=Capacity.SPOT,
                          region="us-central1",
                          template=JobTemplate(worker_pools=(WorkerPool(command=("true",)),)),
                          env={}, labels={}, display_name=run_id)
    launcher.launch(spec("a"))  # a find (1 request) and a create (1 request, 1 submission)
    with pytest.raises(LaunchError) as err:  # its find passes; the minute's one submission is used
        launcher.launch(spec("b"))
    assert err.value.code == "RESOURCE_EXHAUSTED" and not err.value.permanent
    assert jobs.created == 1
    assert list(launcher.list_live("us-central1")) == []  # the 4th request
    started = clock.t
    assert list(launcher.list_live("us-central1")) == []  # waits for requests to come back
    assert 0 < clock.t - started <= LIST_PAGE_WAIT_S
