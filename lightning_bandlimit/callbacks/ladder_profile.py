"""The first training step of :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit`, which
measures the job's checkpointable units before the ladder has exact rungs (:class:`FirstStep`).

The step runs every unit plainly (or, beside peers on the device, every unit checkpointed) and
records, per unit, what it keeps for backward, its recompute time and a few samples of its input
(:class:`Profiling`). At the step's end the units are tried on those samples: a unit whose
gradients are not exact when checkpointed leaves the ladder (:func:`failed_trials`), and the
rest are ordered into rungs, by bytes freed per second of recompute or by whole stages
(:meth:`FirstStep.measure`, :class:`ProfileOutcome`). What was measured goes to the controller
through :class:`~lightning_bandlimit.callbacks.ladder_events.LadderEvents` (the stages, what each
frees, where the compression continuum runs), is said once (:func:`describe_stages`), and the job
moves to the rung the step leaves it on (:meth:`FirstStep.finish`). An out-of-memory error in
the step restarts the measurement with every unit checkpointed
(:meth:`FirstStep.restart_after_oom`, called by the backstop,
:mod:`~lightning_bandlimit.callbacks.ladder_backstop`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_bandlimit.callbacks.ladder_events import LadderEvents
from lightning_bandlimit.callbacks.ladder_stages import ExactRungs
from lightning_bandlimit.callbacks.ladder_step_peak import StepPeak
from lightning_bandlimit.ladder.setting import Setting
from lightning_bandlimit.recompute.plan import RungPlan, parse_move
from lightning_bandlimit.recompute.profile import UnitProfile
from lightning_bandlimit.recompute.rungs import CheckpointRungs
from lightning_bandlimit.recompute.sampled_savings import sampled_savings, sampled_unit_savings
from lightning_bandlimit.recompute.switch import FULL, POINTWISE
from lightning_bandlimit.recompute.trial import trial
from lightning_bandlimit.utils.units import MIB

__all__ = [
    "TRIAL_COMPRESSION",
    "FirstStep",
    "FirstStepEnd",
    "ProfileOutcome",
    "Profiling",
    "describe_stages",
    "failed_trials",
]

# The compression the units are also tried at when checkpointed (with the lossy lever): the
# middle of the range the continuum runs over, where a unit keeping its kept spectrum differs
# most from its plain forward.
TRIAL_COMPRESSION = 0.5


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
        stages: CheckpointRungs,
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

    def savings(self, stages: CheckpointRungs, drop: list[str]) -> tuple[list[int] | None, list[int] | None]:
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
        stages: CheckpointRungs,
        drop: list[str],
        no_pointwise: list[str],
        max_rungs: int,
        pointwise: bool = True,
    ) -> RungPlan | None:
        """The rungs by bytes freed per second of recompute
        (:meth:`~lightning_bandlimit.recompute.profile.UnitProfile.plan`); measured checkpointed,
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
    stages: CheckpointRungs,
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
    """What the first step measured of the units (:meth:`FirstStep.measure`).

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


class FirstStepEnd(NamedTuple):
    """Where the first step leaves the job (:meth:`FirstStep.finish`)."""

    rung: int  # the rung to run at: the restored one (measured plainly) or the top (checkpointed)
    oom_step: int | None = None  # a step whose out-of-memory retry is to be recorded, at that rung


class FirstStep:
    """The first training step of a job with checkpointable units: it measures them
    (:class:`Profiling`), then gives the controller the rungs they make.

    Args:
        rungs: the job's exact rungs; their stages are set (or, no unit exact, dropped) here.
        events: the one feeder of the job's controller (read here, changed through it).
        continuum_rung: where the compression continuum runs: ``"auto"`` (the top rung when every
            unit keeps its kept spectrum when checkpointed, else rung 0), ``"top"`` or ``"zero"``.

    Attributes:
        profiling: the measurement under way, from :meth:`start` to :meth:`finish`; ``None``
            otherwise.

    Example:
        >>> from lightning_bandlimit.ladder.controller import LadderController
        >>> first = FirstStep(ExactRungs(None), LadderEvents(LadderController()), "auto")
        >>> first.pending, first.profiling  # no units: nothing to measure
        (False, None)
    """

    def __init__(self, rungs: ExactRungs, events: LadderEvents, continuum_rung: str) -> None:
        self.rungs = rungs
        self.events = events
        self.continuum_rung = continuum_rung
        self.profiling: Profiling | None = None

    @property
    def pending(self) -> bool:
        """Whether the job has units whose stages are not known yet (the next step measures them)."""
        return self.rungs.stages is not None and not self.rungs.staged

    def start(self, exclude: Any, on_top: bool) -> None:
        """The step starting now runs every unit plainly (``on_top``: checkpointed, beside peers)
        and measures them (``exclude``: tensors not counted, e.g. the parameters)."""
        assert self.rungs.stages is not None
        self.profiling = Profiling.start(self.rungs.stages, exclude, checkpointed=on_top)

    def restart_after_oom(self, step: int) -> None:
        """The measured step ``step`` ran out of memory: measure the units again, checkpointed."""
        assert self.rungs.stages is not None
        self.profiling = Profiling.start(self.rungs.stages, (), oom_step=step)

    def close(self) -> int | None:
        """Stop recording (before backward); the job's peak the step measured, if any."""
        return self.profiling.close() if self.profiling is not None else None

    def measure(self, trial_compressions: list[float | None], world_size: int) -> ProfileOutcome | None:
        """The stages the first step measured, with the units not exact when checkpointed (tried
        at ``trial_compressions``) off the ladder; ``None`` (said once) when no unit is exact:
        the rungs then have no stages."""
        rungs = self.rungs
        assert rungs.stages is not None and self.profiling is not None
        profiling, self.profiling = self.profiling, None
        profile = profiling.profile
        failed = failed_trials(rungs.stages, profile, trial_compressions, world_size)
        if failed:
            rungs.stages.remove(failed)
        stages = profile.stages(drop=failed)
        if not stages:
            rank_zero_warn(
                "AdaptiveBandLimit: no unit is exact when checkpointed; the ladder is the compression alone"
            )
            rungs.stages = None
            profile.inputs.clear()
            return None
        ordered = None
        if rungs.order != "stages":  # the same collectives on every rank, whatever it measured
            pointwise = rungs.order == "pointwise"
            no_pointwise = []
            if pointwise:
                no_pointwise = failed_trials(rungs.stages, profile, trial_compressions, world_size, POINTWISE)
            plan = None
            if profile.inputs:
                plan = profiling.plan(rungs.stages, failed, no_pointwise, rungs.max_rungs, pointwise)
            ordered = None if plan is None else (plan.rungs, _rounded(plan.savings), _rounded(plan.least))
            ordered = _rank_zero_plan(ordered, world_size)
        if ordered is not None:
            stages, savings, least = ordered
            rungs.stages.set_stages(stages)
        else:  # the stages, highest resolution first (bytes unknown: the cost cannot order them)
            rungs.stages.set_stages(stages)
            savings, least = profiling.savings(rungs.stages, failed)
        return ProfileOutcome(stages, savings, least, profiling.checkpointed, profiling.oom_step, failed)

    def finish(self, current: Setting, peak: StepPeak, world_size: int) -> FirstStepEnd:
        """The step ended: the stages it measured go to the controller, with where the
        continuum runs, said once; returns the rung the job runs at now (the caller moves there).

        Measured plainly, the step ran on rung 0: its peak is rung 0's, and the job goes back to
        ``current.rung`` (restored from a checkpoint, or a second fit's), at most the top.
        Measured checkpointed (beside peers, or after an out-of-memory error), it ran on the top
        rung and stays there; a peak measured with units that then left the ladder is dropped.
        """
        controller = self.events.controller
        lossy = controller.lossy and controller.max_compression > current.compression
        also = max(current.compression, min(TRIAL_COMPRESSION, controller.max_compression)) if lossy else None
        outcome = self.measure([None] if also is None else [None, also], world_size)
        if outcome is None:  # no unit is exact: the ladder is the compression alone
            self.events.stages_measured(rungs=0)
            return FirstStepEnd(0)
        count = len(outcome.stages)
        self.events.stages_measured(count, outcome.savings, outcome.least)
        if not outcome.checkpointed:
            if current.rung and peak.bytes:  # the profiled step ran on rung 0: what it measured is rung 0's
                self.events.step_measured(Setting(0, current.compression), float(peak.bytes))
                peak.bytes = None
            end = FirstStepEnd(min(current.rung, count))  # the restored rung (a resumed or a second fit)
        else:  # measured with every unit checkpointed: the top rung
            end = FirstStepEnd(count, outcome.oom_step)
            if outcome.failed:  # measured with units off the ladder
                peak.bytes = None
        stages = self.rungs.stages
        assert stages is not None
        on_top = controller.lossy and (
            self.continuum_rung == "top" or (self.continuum_rung == "auto" and stages.keep_spectrum())
        )
        self.events.continuum_chosen(on_top)
        describe_stages(outcome.stages, outcome.savings, on_top, sampled=outcome.checkpointed)
        return end

    def release(self) -> None:
        """Drop a measurement under way (the fit ended)."""
        self.profiling = None
