"""The Lightning side of the stability guard: a diverged step after a resize rolls every rank back.

:class:`GuardedResize` is a mixin of :class:`~lightning_bandlimit.strategies.ElasticDDPStrategy`
(its ``_watch``, ``_schedulers``, ``_apply_rule``, ``applied``, ``resized_from``); the judging and
the snapshot are :class:`~lightning_bandlimit.strategies.elastic_rollback.RollbackWatch`'s.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn

from lightning_bandlimit.strategies.elastic_rollback import RollbackWatch

__all__ = ["GuardedResize", "log_metrics"]


class GuardedResize:
    """Mixin: the rollbacks done and the check at each batch start (all ranks agree)."""

    _watch: RollbackWatch | None
    applied: Any
    resized_from: int | None
    world_size: int
    lightning_module: Any

    @property
    def rollbacks(self) -> list[dict[str, Any]]:
        """One record per rollback (``step``, ``retry``, ``damping``, ``samples_seen``)."""
        return [] if self._watch is None else self._watch.rollbacks

    def _observe_loss(self, trainer: pl.Trainer) -> None:
        """Roll back if the guard judged the last optimizer step diverged (all ranks agree)."""
        agree = lambda mine: self.reduce_boolean_decision(mine, all=False)  # noqa: E731
        if self._watch is None or not self._watch.diverged(agree):
            return
        schedulers = self._schedulers(trainer)
        snapshot, retry, damping = self._watch.roll_back(
            self.lightning_module, trainer.optimizers, schedulers, self.samples_seen, trainer.global_step
        )
        self.applied = snapshot.applied
        trainer.accumulate_grad_batches = snapshot.accumulation
        rank_zero_warn(
            f"ElasticDDPStrategy: the loss diverged after the resize {self.resized_from} -> "
            f"{self.world_size}; rolled back to the state at the resize and retrying with damping {damping:g}"
            + (" (no rescaling)" if damping == 0 else "")
        )
        log_metrics(trainer, {"ElasticDDPStrategy/rollback": float(retry)})
        self._apply_rule(trainer, damping=damping)
        self._watch.watch()


def log_metrics(trainer: pl.Trainer, metrics: dict[str, float]) -> None:
    """Log ``metrics`` to every logger of ``trainer`` at its global step."""
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)
