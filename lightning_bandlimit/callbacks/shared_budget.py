"""``SharedBudget``: run a job beside a real co-tenant process and measure both, step by step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_bandlimit.callbacks.adaptive_band_limit import AdaptiveBandLimit
from lightning_bandlimit.callbacks.band_limit import BandLimit
from lightning_bandlimit.memory.budget import SharedBudgetProbe
from lightning_bandlimit.memory.cotenant import CoTenant, RampTrace
from lightning_bandlimit.memory.process import peak_resident_bytes, reset_peak_resident, resident_bytes
from lightning_bandlimit.recompute.switch import is_checkpointed
from lightning_bandlimit.utils.units import MIB
from lightning_bandlimit.utils.validation import check_int

__all__ = ["SharedBudget", "over_budget_steps"]


def over_budget_steps(timeline: list[dict[str, Any]], budget: int) -> int:
    """Steps of a :attr:`SharedBudget.timeline` whose job peak plus co-tenant (plus the other jobs
    on the budget, if any) exceeded ``budget``."""
    return sum(r["job_bytes"] + r["cotenant_bytes"] + r.get("peer_bytes", 0) > budget for r in timeline)


class SharedBudget(Callback):
    """A host-memory budget shared with a co-tenant process that grows and leaves during training.

    The CPU stand-in for a GPU shared with another job. In ``setup`` it starts a
    :class:`~lightning_bandlimit.memory.CoTenant`; before every training step the co-tenant
    moves to ``trace(step / total steps)`` and the job's resident high-water mark is reset, after
    it the job's peak resident set during the step is read (``/proc``: measured, not modelled).
    Each step is kept in :attr:`timeline` (job peak bytes, job bytes at the step's start, co-tenant
    bytes, compression of any :class:`BandLimit` callback, the rung of an ``AdaptiveBandLimit`` and the
    number of checkpointed modules, whether the two overdrew ``budget``) and logged as
    ``SharedBudget/job_bytes``, ``.../cotenant_bytes`` and ``.../over_budget``.

    :attr:`probe` (``None`` without a budget) reads the budget's free memory for an
    :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit`: ``budget`` minus the job's
    largest step peak since the previous reading minus the co-tenant's resident set; with it, the
    job's resident set at the start of that step (:attr:`MemoryReading.own_base`). Put this
    callback before the ``AdaptiveBandLimit`` in the callbacks list, so each step is measured
    before the check that reads it.

    The job's resident set follows its tensors only when freed memory leaves the process: on
    glibc, start it with ``MALLOC_MMAP_THRESHOLD_=131072`` (what the benchmark and the main job
    do). With the default heap the resident set stays at its high-water mark, whatever the
    compression.

    Args:
        budget: bytes the job and the co-tenant share; ``None`` records without a budget (a
            baseline run; :meth:`over_budget_steps` can apply one afterwards).
        trace: the co-tenant's bytes over the run.
        chunk_bytes: the co-tenant's allocation granularity.
        peers: returns the bytes of other training jobs on the same budget now (measured, e.g.
            their resident sets); they count as the co-tenant does (``peer_bytes`` in the timeline).

    Raises:
        TypeError: if ``budget`` is not an integer number of bytes or ``trace`` is not a
            :class:`~lightning_bandlimit.memory.RampTrace`.
        ValueError: if ``budget`` is not positive.

    Example:
        >>> from lightning_bandlimit.memory import RampTrace
        >>> from lightning_bandlimit.utils.units import GIB
        >>> shared = SharedBudget(budget=2 * GIB, trace=RampTrace(low=0, high=256 * MIB))
        >>> shared.probe.read().total == 2 * GIB
        True
    """

    def __init__(
        self,
        budget: int | None,
        trace: RampTrace,
        chunk_bytes: int = MIB,
        peers: Callable[[], int] | None = None,
    ) -> None:
        super().__init__()
        if budget is not None:
            budget = check_int("budget", budget, minimum=1)
        if not isinstance(trace, RampTrace):
            raise TypeError(f"trace must be a RampTrace, got {type(trace).__name__}")
        self.budget, self.trace, self.chunk_bytes, self.peers = budget, trace, chunk_bytes, peers
        self._step_peers = 0
        self.cotenant: CoTenant | None = None
        self.timeline: list[dict[str, Any]] = []
        self._total_steps = 1
        self._since_read = 0
        self._since_read_start = 0  # the resident set at the start of that step
        self._step_cotenant = 0
        self._step_start = 0
        self._peak_resets = True
        self.probe: SharedBudgetProbe | None = (
            None
            if budget is None
            else SharedBudgetProbe(
                budget, own=self._own_since_read, others=self._others, own_base=self._start_since_read
            )
        )

    def _own_since_read(self) -> int:
        own, self._since_read = self._since_read or resident_bytes(), 0
        return own

    def _start_since_read(self) -> int:
        return self._since_read_start if self._since_read else resident_bytes()

    def _others(self) -> int:
        return (self.cotenant.resident if self.cotenant is not None else 0) + self._peer_bytes()

    def _peer_bytes(self) -> int:
        return int(self.peers()) if self.peers is not None else 0

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.world_size > 1:
            raise RuntimeError("SharedBudget measures one process; run it without multi-process training")
        adaptive = [i for i, cb in enumerate(trainer.callbacks) if isinstance(cb, AdaptiveBandLimit)]
        if adaptive and adaptive[0] < trainer.callbacks.index(self):
            raise ValueError(
                "put SharedBudget before AdaptiveBandLimit in the callbacks, so each step is measured before "
                "the check"
            )
        self._total_steps = max(1, int(trainer.estimated_stepping_batches))
        self._peak_resets = reset_peak_resident()
        if not self._peak_resets:
            rank_zero_warn(
                "SharedBudget: cannot reset the resident high-water mark; job bytes are read after each step"
            )
        if self.cotenant is None:
            self.cotenant = CoTenant(self.chunk_bytes)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        assert self.cotenant is not None
        self._step_cotenant = self.cotenant.hold(self.trace(trainer.global_step / self._total_steps))
        if self._peak_resets:
            reset_peak_resident()
        self._step_start = resident_bytes()
        self._step_peers = self._peer_bytes()

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        job = peak_resident_bytes() if self._peak_resets else resident_bytes()
        if job >= self._since_read:
            self._since_read, self._since_read_start = job, min(self._step_start, job)
        band = next((cb for cb in trainer.callbacks if isinstance(cb, BandLimit)), None)
        over = self.budget is not None and job + self._step_cotenant + self._step_peers > self.budget
        self.timeline.append(
            {
                "step": trainer.global_step,
                "job_bytes": job,
                "start_bytes": self._step_start,
                "cotenant_bytes": self._step_cotenant,
                "peer_bytes": self._step_peers,
                "compression": band.compression if band is not None else 0.0,
                "rung": getattr(band, "rung", 0),
                "split": getattr(band, "split", 1),
                "checkpointed_units": sum(is_checkpointed(m) for m in pl_module.modules()),
                "over_budget": over,
            }
        )
        pl_module.log("SharedBudget/job_bytes", float(job), on_step=True, on_epoch=False)
        pl_module.log("SharedBudget/cotenant_bytes", float(self._step_cotenant), on_step=True, on_epoch=False)
        pl_module.log("SharedBudget/over_budget", float(over), on_step=True, on_epoch=False)

    def over_budget_steps(self, budget: int | None = None) -> int:
        """Steps whose job peak plus co-tenant exceeded ``budget`` (default: this callback's)."""
        budget = self.budget if budget is None else budget
        if budget is None:
            raise ValueError("no budget: pass one, or give SharedBudget a budget")
        return over_budget_steps(self.timeline, budget)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.cotenant is not None:
            self.cotenant.close()
            self.cotenant = None
