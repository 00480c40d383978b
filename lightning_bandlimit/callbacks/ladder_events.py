"""The one place :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` changes its ladder
controller: each event of the job goes to the controller's method named for it, in the order the
controller needs (a check's measured peak before its decision, the ranks' agreement before both,
a change the shared rule made after it), and what the controller says back is reported once.
Everything else reads the controller only (``tests/test_imports.py`` checks it).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

from lightning_bandlimit.callbacks.ladder_agreement import agree_across_ranks
from lightning_bandlimit.callbacks.ladder_coordinator import Coordinator
from lightning_bandlimit.callbacks.ladder_reading import JobMemory
from lightning_bandlimit.ladder.controller import LadderController
from lightning_bandlimit.ladder.setting import Decision, Setting
from lightning_bandlimit.memory.protocol import MemoryReading

__all__ = ["LadderEvents"]


class LadderEvents:
    """Feeds a :class:`~lightning_bandlimit.ladder.LadderController` the events of a job.

    Args:
        controller: the controller it feeds (the callback keeps it to read).

    Example:
        >>> from lightning_bandlimit.memory.protocol import MemoryReading
        >>> events = LadderEvents(LadderController(rungs=2, min_free=100))
        >>> events.stages_measured(2, [300, 100])
        >>> events.step_measured(Setting(0, 0.0), 1000.0)
        >>> events.decide(MemoryReading(2000, 50, "scripted"), Setting(0, 0.0)).setting  # rung 1 hinted
        Setting(rung=1, compression=0.0)
    """

    def __init__(self, controller: LadderController) -> None:
        self.controller = controller
        self._said_skip = False  # a check skipped on every rank for one rank's probe, said

    def stages_measured(
        self, rungs: int, savings: list[int] | None = None, least: list[int] | None = None
    ) -> None:
        """The stages were measured (their number; what each frees, when known)."""
        self.controller.on_stages_measured(savings, least, rungs=rungs)  # type: ignore[arg-type]

    def continuum_chosen(self, on_top: bool) -> None:
        """Where the compression continuum runs was chosen (once the units are known)."""
        self.controller.on_continuum_chosen(on_top)

    def step_measured(self, setting: Setting, peak: float, base: float | None = None) -> None:
        """The job's peak was measured at ``setting`` (``base``: what it held at the step's
        start, when measured); a rung leaving the ladder is said."""
        if (message := self.controller.observe(setting, peak, base)) is not None:
            rank_zero_info(f"AdaptiveBandLimit: {message}")

    def step_timed(self, rung: int, seconds: float, split: int = 1) -> None:
        """A step on ``rung`` (at ``split``) at the floor compression took ``seconds``; a rung
        leaving the ladder for its time is said."""
        if (message := self.controller.observe_time(rung, seconds, split)) is not None:
            rank_zero_info(f"AdaptiveBandLimit: {message}")

    def ranks_agreed(
        self, strategy: Any, mine: JobMemory | None, device: torch.device | None
    ) -> JobMemory | None:
        """What every rank decides from (:func:`~.ladder_agreement.agree_across_ranks`, one
        collective), given what this rank read (``None``: its probe failed); the agreed top rung
        and continuum go to the controller. ``None``: a rank had no reading, every rank skips the
        check (said once)."""
        agreed = agree_across_ranks(strategy, self.controller, mine, device)
        if agreed is None:
            if mine is not None and not self._said_skip:
                rank_zero_info(
                    "AdaptiveBandLimit: a rank's memory probe failed: every rank skips such checks"
                )
                self._said_skip = True
            return None
        self.controller.on_ranks_agreed(agreed.top, agreed.continuum_on_top, agreed.splits)
        return agreed.measured

    def decide(self, reading: MemoryReading, current: Setting, peer_memory: float | None = None) -> Decision:
        """A check's decision at ``current``, the peers' memory (``SharedDevice``) given."""
        return self.controller.decide(reading, current, peer_memory=peer_memory)

    def coordinate(
        self, coordinator: Coordinator, adaptive: pl.Callback, trainer: pl.Trainer, decision: Decision
    ) -> Decision:
        """``decision`` after the jobs' shared rule; a change the controller did not decide
        restarts its cooldown."""
        coordinated = coordinator(adaptive, trainer, decision)
        if coordinated.outside:
            self.controller.on_outside_change()
        return coordinated.decision

    def out_of_memory(self, current: Setting) -> Setting:
        """A step ran out of memory at ``current``: the setting to retry it with."""
        return self.controller.on_oom(current)

    def splits_chosen(self, splits: tuple[int, ...]) -> None:
        """The micro-batch splits the ladder may use (tried exact; ``()``: none)."""
        self.controller.on_splits_chosen(splits)

    def restore(self, state: dict[str, Any]) -> None:
        """The controller's state from a checkpoint."""
        self.controller.load_state_dict(state)
