"""The stability guard's side of a resize: the state to roll back to, each optimizer step's loss
judged by the :class:`~lightning_bandlimit.strategies.StabilityGuard` (the ranks agreeing), and
the rollbacks done.

``ElasticDDPStrategy`` arms a :class:`RollbackWatch` with an ``elastic_resize.Snapshot`` at each
resize; while the guard watches, a diverged step makes every rank restore the snapshot and retry
the rule with the guard's damping. Nothing here knows Lightning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from lightning_bandlimit.strategies.elastic_resize import Snapshot
from lightning_bandlimit.strategies.stability import StabilityGuard

__all__ = ["RollbackWatch"]


class RollbackWatch:
    """Judges each optimizer step's loss after a resize and rolls back on divergence.

    Args:
        guard: the guard that judges the losses.

    Attributes:
        rollbacks: one record per rollback (``step``, ``retry``, ``damping``, ``samples_seen``).

    Example:
        >>> watch = RollbackWatch(StabilityGuard(window=2, patience=1, tolerance=1.5))
        >>> watch.step_loss(torch.tensor(1.0)); watch.diverged(agree=lambda mine: mine)
        False
    """

    def __init__(self, guard: StabilityGuard) -> None:
        self.guard = guard
        self.rollbacks: list[dict[str, Any]] = []
        self._snapshot: Snapshot | None = None
        self._pending: torch.Tensor | None = None

    def arm(self, snapshot: Snapshot) -> None:
        """Keep ``snapshot`` (the state at a resize) to roll back to."""
        self._snapshot = snapshot

    def watch(self) -> None:
        """Start judging the losses (after the rule was applied)."""
        self.guard.start()

    def step_loss(self, loss: torch.Tensor | None) -> None:
        """The loss of the optimizer step just done (judged at the next batch start)."""
        self._pending = loss

    def diverged(self, agree: Callable[[bool], bool]) -> bool:
        """Judge the pending loss; whether every rank must roll back now.

        Args:
            agree: whether any rank says so (a collective: every rank watches the same steps).
        """
        if self._pending is None:
            return False
        was_watching = self.guard.watching
        verdict = self.guard.record(float(self._pending))
        self._pending = None
        if not was_watching:
            return False
        if agree(verdict == "diverged"):
            if self.guard.watching:
                self.guard.stop()
            return True
        if verdict == "stable":
            self._snapshot = None
        return False

    def roll_back(
        self,
        module: torch.nn.Module,
        optimizers: Sequence[torch.optim.Optimizer],
        schedulers: Sequence[Any],
        samples_seen: int,
        step: int,
    ) -> tuple[Snapshot, int, float]:
        """Restore the snapshot; the snapshot, the retry number and the damping to retry with."""
        assert self._snapshot is not None
        self._snapshot.restore(module, optimizers, schedulers, samples_seen)
        retry = len(self.rollbacks) + 1
        damping = self.guard.damping(retry)
        self.rollbacks.append(
            {"step": step, "retry": retry, "damping": damping, "samples_seen": samples_seen}
        )
        return self._snapshot, retry, damping
