"""The exact rungs of :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit`
(:class:`ExactRungs`: the stages and the rung the job runs at): which units it checkpoints
(:func:`find_stages`), the first step that measures them (:class:`Profiling`), the trials that
keep only exact units (:func:`failed_trials`), and what it says about them (no units found,
units kept in full at a compression)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_bandlimit.recompute.plan import RungPlan, parse_move
from lightning_bandlimit.recompute.sampled_savings import sampled_savings, sampled_unit_savings
from lightning_bandlimit.recompute.stages import CheckpointStages, UnitProfile, checkpoint_units
from lightning_bandlimit.recompute.switch import FULL, POINTWISE
from lightning_bandlimit.recompute.trial import trial
from lightning_bandlimit.utils.units import MIB

__all__ = [
    "ExactRungs",
    "FallbackReport",
    "ProfileOutcome",
    "Profiling",
    "describe_stages",
    "failed_trials",
    "find_stages",
]


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


@dataclass
class Profiling:
    """The profiling phase: the first training step, which measures the units (their stages
    and what each frees) while it runs. One state for the whole phase.

    Attributes:
        profile: the units' profile, recording until :meth:`close`.
        checkpointed: measured with every unit checkpointed (on the top rung: beside peers that
            share the device, or after an out-of-memory error): the stages are known; what each
            frees is measured on the recorded samples (:meth:`savings`; after an out-of-memory
            error, nothing is recorded and it stays unknown).
        oom_step: the step whose first attempt ran out of memory (recorded once the retry
            measured the stages).
    """

    profile: UnitProfile
    checkpointed: bool = False
    oom_step: int | None = None
    recording: bool = True

    @classmethod
    def start(
        cls,
        stages: CheckpointStages,
        exclude: Any,
        record: int = 4,
        oom_step: int | None = None,
        checkpointed: bool = False,
    ) -> Profiling:
        """Open a profile of the next forward, keeping ``record`` samples of each unit's input to
        try it on; with ``checkpointed`` every unit runs checkpointed (after an out-of-memory
        error, ``oom_step``, nothing is kept or metered)."""
        if oom_step is not None:  # stages only: no samples to try, no bytes to meter
            profile = stages.profile(checkpointed=True)
        else:
            profile = stages.profile(exclude=exclude, checkpointed=checkpointed, record=record)
        return cls(profile.__enter__(), checkpointed=checkpointed or oom_step is not None, oom_step=oom_step)

    def close(self) -> int | None:
        """Stop recording (before backward); returns the job's peak it measured, if it measured one."""
        if not self.recording:
            return None
        self.profile.__exit__(None, None, None)
        self.recording = False
        return None if self.oom_step is not None else self.profile.meter.bytes

    def savings(self, stages: CheckpointStages, drop: list[str]) -> tuple[list[int] | None, list[int] | None]:
        """Bytes checkpointing each stage frees (``drop``: units off the ladder), and the least it
        may free: seen by a plain profile (both); from the recorded samples of a checkpointed one
        (:func:`~lightning_bandlimit.recompute.sampled_savings.sampled_savings`, an upper figure;
        less the stages' inputs as the profile measured them, the least), unknown after an
        out-of-memory error (nothing recorded). The samples are let go."""
        try:
            if not self.checkpointed:
                seen = self.profile.savings(drop=drop)
                return seen, seen
            upper = sampled_savings(stages, self.profile, drop)
            if upper is None:
                return None, None
            inputs = [
                sum(self.profile.input_bytes.get(n, 0) for n in stage) for stage in self.profile.stages(drop)
            ]
            return upper, [max(0, s - i) for s, i in zip(upper, inputs, strict=True)]
        finally:
            self.profile.inputs.clear()

    def plan(
        self,
        stages: CheckpointStages,
        drop: list[str],
        no_pointwise: list[str],
        max_rungs: int,
        pointwise: bool = True,
    ) -> RungPlan | None:
        """The rungs by bytes freed per second of recompute
        (:meth:`~lightning_bandlimit.recompute.stages.UnitProfile.plan`); measured checkpointed,
        each unit's bytes come from the recorded samples (:meth:`savings`' upper figure, less
        its input the least); ``None`` where they are unknown (after an out-of-memory error)."""
        try:
            profile = self.profile
            if not self.checkpointed:
                return profile.plan(drop, no_pointwise, max_rungs=max_rungs, pointwise=pointwise)
            full = sampled_unit_savings(stages, profile, drop)
            if full is None:
                return None
            least = {n: max(0, b - profile.input_bytes.get(n, 0)) for n, b in full.items()}
            return profile.plan(drop, no_pointwise, full, least, max_rungs, pointwise)
        finally:
            self.profile.inputs.clear()


def failed_trials(
    stages: CheckpointStages,
    profile: UnitProfile,
    compressions: list[float | None],
    world_size: int = 1,
    mode: str = FULL,
) -> list[str]:
    """The units that are not exact when checkpointed (:func:`~lightning_bandlimit.recompute.trial.trial`
    on the profile's recorded samples, kept for :meth:`Profiling.savings`, at each of
    ``compressions``; ``None``: as the model is) in ``mode``; one warning names them (in the
    pointwise mode they keep their full mode). Under DDP a unit that fails on any rank fails on
    every rank (the ranks' units may differ: names are gathered, one collective)."""
    reasons: dict[str, str] = {}
    for name, args in profile.inputs.items():
        for compression in compressions:
            unit = stages.units.get(name)
            if unit is None:
                continue
            reason = trial(name, unit, args, compression, autocast=profile.autocast.get(name), mode=mode)
            if reason is not None:
                reasons[name] = reason if compression is None else f"{reason} (at compression {compression})"
                break
    if world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        gathered: list[list[str] | None] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, sorted(reasons))
        for name in sorted({n for names in gathered for n in names or ()} - set(reasons)):
            if name in stages.units:
                reasons[name] = f"{name}: not exact when checkpointed on another rank"
    if reasons:
        what = "leave the ladder" if mode == FULL else "keep only their full checkpointing"
        rank_zero_warn(
            f"AdaptiveBandLimit: {len(reasons)} of {len(stages.units)} units are not exact when "
            f"checkpointed ({mode}) and {what}: {'; '.join(reasons.values())}"
        )
    return list(reasons)


Plan = tuple[list[list[str]], list[int], list[int]]


def _rounded(values: list[float]) -> list[int]:
    return [round(v) for v in values]


def _rank_zero_plan(plan: Plan | None, world_size: int) -> Plan | None:
    """Under DDP, rank 0's rungs on every rank whose moves are the same (each rank timed its own
    first step; one order keeps a rung the same units everywhere); one collective."""
    if world_size == 1 or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return plan
    shared: list[Any] = [plan]
    torch.distributed.broadcast_object_list(shared, src=0)
    theirs = shared[0]
    moves = lambda p: sorted(m for rung in p[0] for m in rung)  # noqa: E731
    return theirs if plan is not None and theirs is not None and moves(theirs) == moves(plan) else plan


def describe_stages(
    stages: list[list[str]], savings: list[int] | None, on_top: bool, sampled: bool = False
) -> None:
    """Say once what the ladder's exact rungs are, what each frees (``sampled``: at most, from
    samples of each unit's input) and where the continuum runs."""
    how = " at most (from samples: measured all checkpointed, beside peers)" if sampled else ""
    freed = (
        f"bytes each frees{how}: {[f'{s / MIB:.1f} MiB' for s in savings]}"
        if savings is not None
        else "bytes each frees: unknown (measured all checkpointed after an out-of-memory error)"
    )
    continuum = (
        "the compression continuum runs on the top rung (checkpointed blocks keep their kept spectrum)"
        if on_top
        else "the compression continuum runs on rung 0"
    )
    units = len({parse_move(move)[0] for stage in stages for move in stage})
    moves = sum(map(len, stages))
    how = "stages, highest resolution first" if moves == units else "cheapest bytes first"
    rank_zero_info(
        f"AdaptiveBandLimit: {len(stages)} checkpointing rungs over {units} units "
        f"({how}: {stages}); {freed}; {continuum}"
    )


@dataclass
class ProfileOutcome:
    """What the first step measured of the units (:meth:`ExactRungs.finish_profile`).

    Attributes:
        stages: the stages, highest resolution first (units off the ladder left out).
        savings: bytes checkpointing each stage frees (``None``: unknown).
        least: the least each may free.
        checkpointed: measured with every unit checkpointed (the job then runs its top rung).
        oom_step: the step whose first attempt ran out of memory, if the profile was its retry.
        failed: units that left the ladder (not exact when checkpointed).
    """

    stages: list[list[str]]
    savings: list[int] | None
    least: list[int] | None
    checkpointed: bool
    oom_step: int | None
    failed: list[str]


class ExactRungs:
    """A job's exact rungs: its checkpointable units grouped in stages, the rung it runs at (held
    here alone; the units are switched to it), the first step that measures the units, and what
    is said of them.

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
        >>> rungs.rung, rungs.units_at(2), rungs.checkpointed()
        (2, 0, [])
    """

    def __init__(
        self, stages: CheckpointStages | None, rung: int = 0, order: str = "cost", max_rungs: int = 8
    ) -> None:
        self.stages = stages
        self._rung = rung
        self.order, self.max_rungs = order, max_rungs
        self.profiling: Profiling | None = None  # the first training step, measuring the units
        self.saved_stages: list[list[str]] | None = None  # from a checkpoint, until applied
        self._fallbacks = FallbackReport()

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

    def restore(self, top: int) -> bool | None:
        """At the start of training, the stages saved in a checkpoint applied, at the saved rung
        (at most ``top``). ``True``: applied; ``False``: they name other units (said once), to be
        measured again; ``None``: nothing to restore (no units, stages known, or none saved)."""
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
        self.rung = min(self._rung, top)
        return True

    def start_profile(self, exclude: Any, on_top: bool) -> None:
        """The first step runs every unit plainly (``on_top``: checkpointed) and measures them."""
        assert self.stages is not None
        self.profiling = Profiling.start(self.stages, exclude, checkpointed=on_top)

    def restart_profile_after_oom(self, step: int) -> None:
        """The profiled step ``step`` ran out of memory: measure the units again, checkpointed."""
        assert self.stages is not None
        self.profiling = Profiling.start(self.stages, (), oom_step=step)

    def finish_profile(
        self, trial_compressions: list[float | None], world_size: int
    ) -> ProfileOutcome | None:
        """The stages the first step measured, with the units not exact when checkpointed (tried
        at ``trial_compressions``) off the ladder; ``None`` (said once) when no unit is exact."""
        assert self.stages is not None and self.profiling is not None
        profiling, self.profiling = self.profiling, None
        profile = profiling.profile
        failed = failed_trials(self.stages, profile, trial_compressions, world_size)
        if failed:
            self.stages.remove(failed)
        stages = profile.stages(drop=failed)
        if not stages:
            rank_zero_warn(
                "AdaptiveBandLimit: no unit is exact when checkpointed; the ladder is the compression alone"
            )
            self.stages, self._rung = None, 0
            profile.inputs.clear()
            return None
        ordered = None
        if self.order != "stages":  # the same collectives on every rank, whatever it measured
            pointwise = self.order == "pointwise"
            no_pointwise = []
            if pointwise:
                no_pointwise = failed_trials(self.stages, profile, trial_compressions, world_size, POINTWISE)
            plan = None
            if profile.inputs:
                plan = profiling.plan(self.stages, failed, no_pointwise, self.max_rungs, pointwise)
            ordered = None if plan is None else (plan.rungs, _rounded(plan.savings), _rounded(plan.least))
            ordered = _rank_zero_plan(ordered, world_size)
        if ordered is not None:
            stages, savings, least = ordered
            self.stages.set_stages(stages)
        else:  # the stages, highest resolution first (bytes unknown: the cost cannot order them)
            self.stages.set_stages(stages)
            savings, least = profiling.savings(self.stages, failed)
        return ProfileOutcome(stages, savings, least, profiling.checkpointed, profiling.oom_step, failed)

    def report_fallbacks(self, compression: float) -> None:
        """Say which checkpointed units keep their full input at ``compression`` (once per set)."""
        if self.stages is not None:
            self._fallbacks(self.stages, compression)

    def release(self) -> None:
        """The user's model as it was; the rung is kept for a next fit to apply."""
        self.profiling = None
        if self.stages is not None:
            self.stages.release()
            self.stages = None
