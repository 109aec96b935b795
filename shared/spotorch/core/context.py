"""What a decision needs besides the run: its pipeline, the time, the regions and outlook."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from spotorch.core import hardware as hw
from spotorch.core import health as hp
from spotorch.core.pipeline import Pipeline, RecoveryPolicy
from spotorch.core.policy import RegionRecord
from spotorch.core.price_list import LIST_PRICES
from spotorch.core.prices import PriceTable


@dataclass(frozen=True)
class Context:
    """What a decision needs besides the run: its pipeline and the time."""

    pipeline: Pipeline
    now: float
    # The pipeline's regions, best first for this run's shape, from the shared record of Spot
    # behaviour (service.spot_regions); None: the pipeline's own order.
    region_order: tuple[str, ...] | None = None
    # The same record's figures per region (issue 43: the priors of the run's own estimates,
    # core.region_moves); None: not read.
    region_records: Mapping[str, RegionRecord] | None = None
    # What the hardware choice assumes of Spot per candidate (the shared record); None: nothing
    outlook: hw.Outlook | None = None
    hardware_cache: Mapping[str, hw.ProbeResult] | None = None  # a queued run's, at its promotion
    prices: PriceTable = LIST_PRICES  # what the ledger prices with (SPOTORCH_PRICES, if set)
    # Random bytes minted by the shell for this decision (spotorch.app.deps.context): the keys
    # of the attempts it launches derive from them. Empty: launched attempts get no key, so no
    # trainer report is ever believed for them (fail closed).
    key_seed: bytes = field(default=b"", repr=False)

    @property
    def regions(self) -> tuple[str, ...]:
        """The pipeline's regions, best first by the Spot record's order when there is one."""
        configured = self.pipeline.job.regions or ("us-central1",)
        if not self.region_order:
            return configured
        ranked = tuple(r for r in self.region_order if r in configured)
        return ranked + tuple(r for r in configured if r not in ranked)

    @property
    def recovery(self) -> RecoveryPolicy:
        """The pipeline's recovery policy."""
        return self.pipeline.recovery

    @property
    def health(self) -> hp.HealthPolicy:
        """The pipeline's training health policy."""
        return self.pipeline.health
