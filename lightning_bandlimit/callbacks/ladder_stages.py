"""The exact rungs of :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit`
(:class:`ExactRungs`: the stages and the rung the job runs at): which units it checkpoints
(:func:`find_stages`), the stages a checkpoint saved (applied at the start of training), the
stages it keeps known once the fit released the units (its plan, :attr:`ExactRungs.plan`, what a
checkpoint saves), and what it says about them (no units found, units kept in full at a
compression). The first step, which measures the units and sets the stages, is
:mod:`~lightning_bandlimit.callbacks.ladder_profile`."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_bandlimit.recompute.plan import parse_move
from lightning_bandlimit.recompute.rungs import CheckpointRungs
from lightning_bandlimit.recompute.switch import FULL
from lightning_bandlimit.recompute.unit_choice import checkpoint_units

__all__ = ["ExactRungs", "FallbackReport", "find_stages"]


def find_stages(pl_module: pl.LightningModule, patterns: tuple[str, ...] | None) -> CheckpointRungs | None:
    """The checkpointable units of ``pl_module`` (those ``patterns`` name, else found
    automatically), or ``None`` with a message saying the ladder has no checkpointing rungs."""
    units = checkpoint_units(pl_module, include=patterns)
    if units:
        return CheckpointRungs(units)
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

    def __call__(self, stages: CheckpointRungs, compression: float) -> None:
        fallbacks = stages.fallbacks()
        if fallbacks and fallbacks.keys() != self.reported:
            self.reported = set(fallbacks)
            details = "; ".join(f"{name}: {reason}" for name, reason in fallbacks.items())
            rank_zero_info(
                f"AdaptiveBandLimit: {len(fallbacks)} checkpointed units keep their full input "
                f"(ordinary checkpointing) at compression {compression:.3f}: {details}"
            )


class ExactRungs:
    """A job's exact rungs: its checkpointable units grouped in stages, the rung it runs at (held
    here; the units are switched to it; set only by the callback's one move,
    ``AdaptiveBandLimit._move_to``), the stages a checkpoint saved, the plan (the stages known,
    kept when the fit's end releases the units), and what is said of them.

    Args:
        stages: the units (:func:`find_stages`), ``None``: no exact rungs.
        rung: the rung to run at once the stages are known (e.g. restored from a checkpoint).
        order: ``"cost"``: the rungs take the cheapest bytes first, a unit or a few per rung, at
            most ``max_rungs`` (:mod:`lightning_bandlimit.recompute.plan`); ``"pointwise"``: the
            same with each unit's pointwise mode as a move before its full one; ``"stages"``:
            rung ``r`` checkpoints the first ``r`` stages in full (highest resolution first).
        max_rungs: the most rungs with ``order="cost"``.

    Example:
        >>> rungs = ExactRungs(None, rung=2)  # no units: the rung is kept for when they are known
        >>> rungs.rung, rungs.units_at(2), rungs.checkpointed(), rungs.plan
        (2, 0, [], None)
    """

    def __init__(
        self, stages: CheckpointRungs | None, rung: int = 0, order: str = "cost", max_rungs: int = 8
    ) -> None:
        self.stages = stages
        self._rung = rung
        self.order, self.max_rungs = order, max_rungs
        self.saved_stages: list[list[str]] | None = None  # from a checkpoint, until applied
        self._released: list[list[str]] | None = None  # the stages of a fit that released its units
        self._fallbacks = FallbackReport()

    def find(self, pl_module: pl.LightningModule, patterns: tuple[str, ...] | None) -> None:
        """A fit's units (:func:`find_stages`), to be measured by its first step (or given the
        stages a checkpoint saved); the plan an earlier fit released gives way to them."""
        self.stages = find_stages(pl_module, patterns)
        self._released = None

    @property
    def plan(self) -> list[list[str]] | None:
        """The stages the rungs checkpoint, as a checkpoint saves them: those known in this fit
        (measured, or restored), else those a checkpoint saved (applied at the start of training),
        else those of the fit that released its units (:meth:`release`: a checkpoint saved after
        the fit holds what one saved during it held); ``None``: none known."""
        if self.staged:
            return [list(stage) for stage in self.stages.stages]  # type: ignore[union-attr]
        if self.saved_stages is not None:
            return self.saved_stages
        return self._released

    @property
    def staged(self) -> bool:
        """Whether the stages are known (the units measured, or restored)."""
        return self.stages is not None and self.stages.stages is not None

    @property
    def rung(self) -> int:
        """The rung the job runs at."""
        return self._rung

    @rung.setter
    def rung(self, rung: int) -> None:
        self._rung = rung
        if self.staged and rung != self.stages.rung:  # type: ignore[union-attr]
            self.stages.apply(rung)  # type: ignore[union-attr]

    def units_at(self, rung: int) -> int:
        """How many units ``rung`` checkpoints (``0`` before the stages are known)."""
        return self.stages.units_at(rung) if self.stages is not None else 0

    def checkpointed(self) -> list[str]:
        """Names of the units checkpointed now."""
        return self.stages.checkpointed() if self.stages is not None else []

    def restore(self) -> bool | None:
        """At the start of training, the stages saved in a checkpoint applied. ``True``: applied
        (the caller then moves to the saved rung, at most the top); ``False``: they name other
        units (said once), to be measured again; ``None``: nothing to restore (no units, stages
        known, or none saved)."""
        saved, self.saved_stages = self.saved_stages, None
        if self.stages is None or self.staged or not saved:
            return None
        full = sorted(n for stage in saved for n in stage if parse_move(n)[1] == FULL)
        if full != sorted(self.stages.units):
            rank_zero_info(
                "AdaptiveBandLimit: the checkpoint's stages name other units; measuring them again"
            )
            return False
        self.stages.set_stages(saved)  # resumed: no profiling step, the saved rung from the first step
        return True

    def report_fallbacks(self, compression: float) -> None:
        """Say which checkpointed units keep their full input at ``compression`` (once per set)."""
        if self.stages is not None:
            self._fallbacks(self.stages, compression)

    def release(self) -> None:
        """The user's model as it was (every unit back to its own class): what the rung applied
        is undone, not what is known. The rung is kept for a next fit to apply, and the stages as
        the plan (:attr:`plan`: a checkpoint saved after the fit, as users save one once ``fit``
        returns, holds the stages a resumed job applies, as one saved during the fit does)."""
        if self.stages is not None:
            self._released = self.plan
            self.stages.release()
            self.stages = None
