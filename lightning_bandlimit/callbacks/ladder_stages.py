"""The exact rungs of :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit`: which units it
checkpoints, and what it says about them (no units found, units kept in full at a compression)."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_bandlimit.recompute.stages import CheckpointStages, checkpoint_units

__all__ = ["FallbackReport", "find_stages"]


def find_stages(pl_module: pl.LightningModule, patterns: tuple[str, ...] | None) -> CheckpointStages | None:
    """The checkpointable units of ``pl_module`` (those ``patterns`` name, else found
    automatically), or ``None`` with a message saying the ladder has no checkpointing rungs."""
    units = checkpoint_units(pl_module, include=patterns)
    if units:
        return CheckpointStages(units)
    if patterns is not None:
        rank_zero_warn(
            f"AdaptiveBandLimit: checkpoint_units={list(patterns)} matches no module of "
            f"{type(pl_module).__name__}; the ladder has no checkpointing rungs"
        )
    else:
        rank_zero_info(
            f"AdaptiveBandLimit: no checkpointable units (residual blocks) found in "
            f"{type(pl_module).__name__}; the ladder is the compression alone (name units with "
            "checkpoint_units=[...])"
        )
    return None


class FallbackReport:
    """Says once (again only when the set changes) which checkpointed units keep their full input
    (ordinary checkpointing) at a band-limiting compression on the top rung."""

    def __init__(self) -> None:
        self.reported: set[str] = set()

    def __call__(self, stages: CheckpointStages, compression: float) -> None:
        fallbacks = stages.fallbacks()
        if fallbacks and fallbacks.keys() != self.reported:
            self.reported = set(fallbacks)
            details = "; ".join(f"{name}: {reason}" for name, reason in fallbacks.items())
            rank_zero_info(
                f"AdaptiveBandLimit: {len(fallbacks)} checkpointed units keep their full input "
                f"(ordinary checkpointing) at compression {compression:.3f}: {details}"
            )
