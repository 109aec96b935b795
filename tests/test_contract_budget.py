"""One contract suite for the request Budget port; one subclass per budget: this instance's own
(RequestBudget), and the one shared through the document store (memory, Firestore emulator)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from spotorch.adapters.gcp.firestore import FirestoreDocumentStore
from spotorch.adapters.gcp.vertex_budgets import RequestBudget, SharedRequestBudget
from spotorch.adapters.memory.twins import InMemoryDocumentStore
from spotorch.local.emulators import EmulatorSet
from spotorch.ports.budget import CRUD, SUBMIT, Budget
from spotorch.ports.jobs import LaunchError
from spotorch.ports.store import DocumentStore

T0 = 1_800_000_000.0
Make = Callable[[dict[str, float]], Budget]  # per-minute limits of each kind -> a budget


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class BudgetContract:
    """What every Budget must do; subclasses provide `make` (time stands still unless slept)."""

    @pytest.fixture
    def make(self) -> Make:
        raise NotImplementedError

    def test_calls_within_the_limit_go(self, make: Make) -> None:
        budget = make({CRUD: 4.0, SUBMIT: 2.0})
        for _ in range(2):
            budget.take("us-central1", (CRUD, SUBMIT), max_wait_s=0.0)
        budget.take("us-central1", (CRUD,), max_wait_s=0.0)

    def test_a_spent_budget_refuses_with_vertex_s_transient_code(self, make: Make) -> None:
        budget = make({CRUD: 4.0, SUBMIT: 1.0})
        budget.take("us-central1", (CRUD, SUBMIT), max_wait_s=0.0)
        with pytest.raises(LaunchError) as refused:
            budget.take("us-central1", (CRUD, SUBMIT), max_wait_s=0.0)
        assert refused.value.code == "RESOURCE_EXHAUSTED" and not refused.value.permanent

    def test_each_region_has_a_budget_of_its_own(self, make: Make) -> None:
        budget = make({CRUD: 4.0, SUBMIT: 1.0})
        budget.take("us-central1", (SUBMIT,), max_wait_s=0.0)
        budget.take("europe-west4", (SUBMIT,), max_wait_s=0.0)
        with pytest.raises(LaunchError):
            budget.take("us-central1", (SUBMIT,), max_wait_s=0.0)


class TestRequestBudget(BudgetContract):
    @pytest.fixture
    def make(self) -> Make:
        clock = Clock()
        return lambda limits: RequestBudget(limits, max_wait_s=0.0, clock=clock,
                                            sleep=clock.sleep)


class SharedOn(BudgetContract):
    @pytest.fixture
    def store(self) -> DocumentStore:
        raise NotImplementedError

    @pytest.fixture
    def make(self, store: DocumentStore) -> Make:
        clock = Clock()
        collection = f"budgets{uuid.uuid4().hex[:8]}"
        return lambda limits: SharedRequestBudget(
            store, limits, share=1.0, blocks_per_horizon=1, max_wait_s=0.0,
            collection=collection, clock=clock, sleep=clock.sleep)


class TestSharedBudgetInMemory(SharedOn):
    @pytest.fixture
    def store(self) -> DocumentStore:
        return InMemoryDocumentStore()


@pytest.mark.emulator
class TestSharedBudgetOnFirestore(SharedOn):
    @pytest.fixture
    def store(self, firestore_emulator: EmulatorSet) -> DocumentStore:
        return FirestoreDocumentStore(project=firestore_emulator.project)
