"""A check of :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` (:class:`LadderCheck`):
every ``check_every_n_steps`` training steps it reads the device and the job
(:class:`~lightning_bandlimit.callbacks.ladder_reading.ProbeReader`), lets the ranks agree on
what they read (under DDP), gives the controller the step's measured peak, lets it decide, says
once when the job's own baseline drifts, and lets the peers' shared rule have the last word
(``SharedDevice``). The callback applies the decision (as ``EarlyStopping`` evaluates, then acts).
"""

from __future__ import annotations

from typing import NamedTuple

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

from lightning_bandlimit.callbacks.ladder_coordinator import Coordinator
from lightning_bandlimit.callbacks.ladder_drift import BaselineDrift
from lightning_bandlimit.callbacks.ladder_events import LadderEvents
from lightning_bandlimit.callbacks.ladder_reading import JobMemory, ProbeReader
from lightning_bandlimit.callbacks.ladder_step_peak import StepPeak
from lightning_bandlimit.ladder.setting import Decision, Setting
from lightning_bandlimit.memory.protocol import MemoryProbe

__all__ = ["Checked", "LadderCheck"]


class Checked(NamedTuple):
    """A check's outcome, for the callback to apply and record."""

    decision: Decision
    peak: int | None  # the job's peak the check learned from (None: not measured)
    base: int | None = None  # what the job held at that step's start (None: not measured)


class LadderCheck:
    """When a job's ladder checks, and what a check decides.

    Args:
        owner: the name messages start with (the callback's).
        every: training steps between two checks.

    Attributes:
        last: the optimizer step of the last check (``-1``: none yet).
        reader: reads the probe; its ``stopped`` says the probe is to be read no more.

    Example:
        >>> check = LadderCheck("AdaptiveBandLimit", every=10)
        >>> check.due(10), check.due(15)
        (True, False)
    """

    def __init__(self, owner: str, every: int) -> None:
        self.every = every
        self.last = -1
        self.reader = ProbeReader(owner)
        self._drift = BaselineDrift(owner)

    def due(self, step: int) -> bool:
        """Whether a check follows optimizer step ``step`` (a batch ends at ``global_step + 1``)."""
        return step % self.every == 0 and step != self.last

    def read(self, probe: MemoryProbe, device: torch.device | None, peak: StepPeak) -> JobMemory | None:
        """What the probe reads of the device and the job, with the metered ``peak``
        (:class:`~.ladder_reading.ProbeReader`): ``None`` (said once per cause) if the probe
        failed, the check skipped; after ``PROBE_FAILURES_TO_STOP`` in a row :attr:`reader`
        says ``stopped``."""
        return self.reader.read(probe, device, peak.bytes, peak.base)

    def decide(
        self,
        trainer: pl.Trainer,
        adaptive: pl.Callback,
        current: Setting,
        read: JobMemory | None,
        events: LadderEvents,
        coordinator: Coordinator | None,
        device: torch.device | None,
    ) -> Checked | None:
        """The decision of the check at ``current`` from what this rank ``read`` (``None``: no
        reading); ``None``: no decision (no reading on some rank, every rank skips the check).
        A rank without a reading still meets the others' collective under DDP."""
        if trainer.world_size > 1:
            read = events.ranks_agreed(trainer.strategy, read, device)
        if read is None:
            return None
        reading, peak, base = read
        if peak:
            events.step_measured(current, float(peak), None if base is None else float(base))
        peers = None if coordinator is None else coordinator.peer_memory()
        decision = events.decide(reading, current, peers)
        large = events.controller.min_free_bytes or 0  # min_free in bytes, as the decision took it
        if (drift := self._drift.update(trainer.global_step, base, large)) is not None:
            rank_zero_info(drift)
        if coordinator is not None:  # other memory-aware jobs on the device (SharedDevice)
            decision = events.coordinate(coordinator, adaptive, trainer, decision)
        return Checked(decision, peak, base)
