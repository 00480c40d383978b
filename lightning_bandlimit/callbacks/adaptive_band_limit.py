"""``AdaptiveBandLimit``: move the compression with the device's free memory."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_bandlimit.callbacks.band_limit import BandLimit
from lightning_bandlimit.callbacks.ladder_decisions import agree_across_ranks, decision_record, log_decision
from lightning_bandlimit.callbacks.ladder_stages import FallbackReport, find_stages
from lightning_bandlimit.callbacks.out_of_memory import (
    free_memory,
    guard_training_step,
    unguard_training_step,
)
from lightning_bandlimit.ladder.controller import LadderController
from lightning_bandlimit.ladder.reasons import OOM
from lightning_bandlimit.ladder.setting import Decision, Setting
from lightning_bandlimit.layers.batchnorm import Forward
from lightning_bandlimit.layers.surgery import Patterns, normalize_patterns
from lightning_bandlimit.memory.probes import MemoryProbe, ProbeUnavailable, auto_probe
from lightning_bandlimit.memory.process import release_cached_memory
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter
from lightning_bandlimit.recompute.stages import CheckpointStages, UnitProfile
from lightning_bandlimit.recompute.trial import trial
from lightning_bandlimit.utils.validation import check_choice, check_compression, check_int

LEVERS = ("checkpoint", "compression")
CONTINUUM_RUNGS = ("auto", "top", "zero")
TRIAL_SAMPLES = 4  # samples of each unit's input kept from the profiled step to try it on

__all__ = ["AdaptiveBandLimit"]


class AdaptiveBandLimit(BandLimit):
    """Keep a job fitting beside other tenants: exact levers first, the spectral cutoff last.

    Every ``check_every_n_steps`` training steps it reads the free memory of the job's device
    (NVML: the whole device, other processes included; else ``torch.cuda.mem_get_info``; on CPU
    the host's available memory and cgroup limit) and lets a
    :class:`~lightning_bandlimit.memory.LadderController` choose a point on a ladder of levers,
    least lossy first:

    1. **Activation checkpointing** (``"checkpoint"`` lever; exact gradients): the model's
       residual-block-like units (:func:`~lightning_bandlimit.recompute.stages.checkpoint_units`,
       or ``checkpoint_units`` patterns) are grouped in stages by output resolution, and rung
       ``r`` checkpoints the first ``r`` stages, highest resolution first. Units are switched
       between optimizer steps, in place (``state_dict`` keys unchanged), in the non-reentrant
       mode (DDP-safe), with BatchNorm running statistics updated once per step.
    2. **Compression** (``"compression"`` lever; lossy): the band-limited layers' compression,
       raised above ``min_compression`` only when the top rung does not suffice. When every
       unit is a block whose input reaches its arithmetic only through band-limited
       convolutions, identity and strided 1x1 shortcuts (ResNet basic blocks), checkpointed
       blocks keep only their kept input spectrum
       (:mod:`lightning_bandlimit.recompute.spectral`) and the compression rises **on the top
       rung**, shrinking what they keep; otherwise on rung 0, with no unit checkpointed (a block
       checkpointed the ordinary way keeps its full-size input, so above the floor
       checkpointing stops paying; see :mod:`lightning_bandlimit.ladder.controller`). Units that
       fall back to ordinary checkpointing at a compression are reported once, with the reason.

    Under pressure (free memory below ``min_free``) it jumps at once to the least lossy point
    predicted to fit; when free memory stays above ``release_free`` it gives back the lossy
    part first, then the exact rungs, so a job with no pressure runs as the plain model. The
    memory of each point is learned online from the job's own peak per check (the probe's
    measurement of the job when it has one, :class:`~lightning_bandlimit.memory.SharedBudgetProbe`;
    ``torch.cuda.max_memory_allocated`` on GPU; else bytes saved for backward), and before a
    rung was visited it is predicted from the bytes each stage frees, measured unit by unit in
    the first training step (which always runs at rung 0). The step time of each rung is
    measured too: ``max_slowdown`` caps it (slower rungs leave the ladder, and compression
    takes over below them).

    ``levers=["compression"]`` is the compression-only controller of earlier releases;
    ``levers=["checkpoint"]`` keeps the job exact (no compression above ``min_compression``).
    A model without checkpointable units (e.g. a plain ``nn.Sequential`` chain) has no exact
    rungs: the ladder is then the compression alone (reported once).

    Like :class:`BandLimit` it swaps the convolutions in ``setup`` when the model has none
    band-limited, and keeps its state (compression, rung, learned memory and times) in
    checkpoints. Logged per check: ``AdaptiveBandLimit/rung``, ``.../checkpointed_units``,
    ``.../compression``, ``.../achieved_compression``, ``.../free_bytes``,
    ``.../job_peak_bytes``, ``.../slowdown`` (the rung's measured step time over rung 0's) and
    ``.../decision`` (-1 lower, 0 hold, 1 raise, 2 out-of-memory retry); every change is also
    reported with its reason and kept in :attr:`decisions`. Under DDP all ranks apply the most
    conservative point any rank asks for, on the same step.

    **What it guarantees, and what it does not.** A co-tenant whose memory grows by less than
    ``min_free`` between two checks is met before the job overdraws, as far as the levers can
    free and as far as the memory model predicts the saving right. It cannot help with memory
    neither lever frees (parameters, optimizer state, the process's own base), a co-tenant that
    grows by more than ``min_free`` within one check interval, or an out-of-memory error in
    ``backward`` or another process. After a change that frees memory it returns cached memory
    to the device (``torch.cuda.empty_cache()``; glibc's ``malloc_trim`` on the host); on the
    host the resident set follows the tensors only with ``MALLOC_MMAP_THRESHOLD_`` set.

    **Out-of-memory backstop** (``oom_backstop=True``, single-process runs): an out-of-memory
    error raised inside ``training_step`` (the forward pass) moves to the top rung (or, there,
    to the compression continuum) and retries that batch once; in the first step, which
    measures the units, it retries with every unit checkpointed. It cannot catch an OOM in
    ``backward``, the optimizer step, data loading or another process; a second OOM on the same
    batch propagates. Under DDP it is off, since one rank retrying alone would desynchronise
    the collectives.

    Args:
        compression: starting compression, in ``[0, 1)`` (refused outside, as by
            :class:`BandLimit`), then clamped into ``[min_compression, max_compression]``.
        min_free: free memory to keep: bytes, or a fraction of the total when below 1.
        release_free: free memory above which levers are given back (same unit).
        min_compression: lower bound of the compression (the exact rungs run at it).
        max_compression: upper bound.
        check_every_n_steps: training steps between two checks.
        probe: ``"auto"`` (best available, one warning on fallback) or a
            :class:`~lightning_bandlimit.memory.MemoryProbe`.
        oom_backstop: retry a batch whose forward ran out of memory, at a higher rung or compression.
        levers: which levers the ladder may use: ``"checkpoint"``, ``"compression"`` or both.
        checkpoint_units: glob patterns over module names choosing the units to checkpoint
            (default: found automatically).
        max_slowdown: the most step time a checkpointing rung may cost relative to none
            (e.g. ``1.3``); ``None``: no cap.
        continuum_rung: where the compression rises past the exact rungs: ``"auto"`` (the top
            rung when every unit keeps its kept spectrum when checkpointed, else rung 0),
            ``"top"`` or ``"zero"``. On the top rung the checkpointed blocks shrink with the
            compression too (far fewer bytes saved for backward) at the recompute's step time;
            a step's peak is often set by the backward's own working set, and then rung 0 at
            the same compression needs about as much memory and runs faster (README,
            "Checkpointed band-limited blocks").
        include: glob patterns over module names to band-limit.
        exclude: glob patterns to leave alone.
        pointwise: also band-limit 1x1 convolutions.
        memory_lean: memory-lean training (see :class:`BandLimit`); on by default, since it is
            what makes a higher compression free memory.
        recalibrate_bn: BatchNorm follows the compression (see :class:`BandLimit`); ``0`` turns
            it off.
        bn_forward: how to run the model on a batch for that re-estimate (see :class:`BandLimit`).
        **controller_kwargs: further :class:`~lightning_bandlimit.memory.LadderController`
            arguments (``raise_step``, ``lower_step``, ``release_checks``, ``cooldown_checks``,
            ``margin``).

    Raises:
        ValueError: for a compression, bounds, thresholds, steps or levers out of range.
        TypeError: for arguments of the wrong type.

    Example:
        >>> from lightning_bandlimit.memory import ScriptedProbe
        >>> trace = ScriptedProbe(free=[900, 50, 50, 900], total=1000)  # a co-tenant comes and goes
        >>> callback = AdaptiveBandLimit(probe=trace, min_free=0.2, release_free=0.5, check_every_n_steps=1)
        >>> callback.compression, callback.rung, callback.levers
        (0.0, 0, ('checkpoint', 'compression'))
    """

    def __init__(
        self,
        compression: float = 0.0,
        min_free: float = 0.1,
        release_free: float | None = None,
        min_compression: float = 0.0,
        max_compression: float = 0.9,
        check_every_n_steps: int = 10,
        probe: MemoryProbe | str = "auto",
        oom_backstop: bool = True,
        levers: Sequence[str] = LEVERS,
        checkpoint_units: Patterns = None,
        max_slowdown: float | None = None,
        continuum_rung: str = "auto",
        include: Patterns = None,
        exclude: Patterns = None,
        pointwise: bool = False,
        memory_lean: bool = True,
        recalibrate_bn: int = 8,
        bn_forward: Forward | None = None,
        **controller_kwargs: Any,
    ) -> None:
        compression = check_compression(compression)  # refused as BandLimit refuses it, then clamped
        levers = _check_levers(levers)
        check_choice("continuum_rung", continuum_rung, CONTINUUM_RUNGS)
        if "compression" not in levers:
            check_compression(max_compression, "max_compression")  # unused then, but refused alike
            max_compression = min_compression
        self.controller = LadderController(
            min_free=min_free,
            release_free=release_free,
            min_compression=min_compression,
            max_compression=max_compression,
            max_slowdown=max_slowdown,
            **controller_kwargs,
        )
        super().__init__(
            compression=self.controller.clamp(compression),
            include=include,
            exclude=exclude,
            pointwise=pointwise,
            memory_lean=memory_lean,
            recalibrate_bn=recalibrate_bn,
            bn_forward=bn_forward,
        )
        check_int("check_every_n_steps", check_every_n_steps, minimum=1)
        if not (isinstance(probe, MemoryProbe) or probe == "auto"):
            error = ValueError if isinstance(probe, str) else TypeError
            raise error(f"probe must be 'auto' or a MemoryProbe, got {probe!r}")
        self.levers = levers
        self.continuum_rung = continuum_rung
        self.checkpoint_units = normalize_patterns("checkpoint_units", checkpoint_units)
        self.check_every_n_steps = check_every_n_steps
        self._probe_spec = probe
        self.probe: MemoryProbe | None = probe if isinstance(probe, MemoryProbe) else None
        self.oom_backstop = oom_backstop
        self.decisions: list[dict[str, Any]] = []
        self.rung = 0
        self._stages: CheckpointStages | None = None
        self._profile: UnitProfile | None = None
        self._profiled: UnitProfile | None = None  # closed before backward, finished after the step
        self._measured_profile = True  # False: the profile runs with every unit checkpointed
        self._oom_while_profiling: int | None = None  # the step whose profile ran out of memory
        self._fallbacks = FallbackReport()
        self._saved_stages: list[list[str]] | None = None  # from a checkpoint, until applied
        self._meter: SavedTensorMeter | None = None
        self._job_peak: int | None = None
        self._device: torch.device | None = None
        self._guarded: pl.LightningModule | None = None
        self._last_check = -1
        self._step_started: float | None = None

    @property
    def setting(self) -> Setting:
        """The ladder point the job runs at: checkpointed stages (rung) and compression."""
        return Setting(self.rung, self.compression)

    @property
    def checkpointed_units(self) -> list[str]:
        """Names of the units checkpointed now."""
        return self._stages.checkpointed() if self._stages is not None else []

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._device = trainer.strategy.root_device
        if self.probe is None and self._probe_spec == "auto":
            self.probe = auto_probe(self._device)  # warns once itself when it falls back or gives up
        if stage == "fit" and "checkpoint" in self.levers and self._stages is None:
            self._stages = find_stages(pl_module, self.checkpoint_units)
        if stage == "fit" and self.oom_backstop:
            if trainer.world_size > 1:
                rank_zero_info(
                    "AdaptiveBandLimit: the out-of-memory backstop is off under multi-process training"
                )
            elif self._guarded is None:
                guard_training_step(pl_module, lambda: self._recover_from_oom(trainer))
                self._guarded = pl_module

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        saved, self._saved_stages = self._saved_stages, None
        if self._stages is None:  # no units (or no checkpoint lever): a saved ladder does not apply
            self.controller.set_rungs(0)
            self.rung = 0
            return
        if self._stages.stages is not None or not saved:
            return
        if sorted(n for stage in saved for n in stage) != sorted(self._stages.units):
            rank_zero_info(
                "AdaptiveBandLimit: the checkpoint's stages name other units; measuring them again"
            )
            self.controller.set_rungs(0)
            return
        self._stages.set_stages(saved)  # resumed: no profiling step, the saved rung from the first step
        self.rung = min(self.rung, self.controller.top)
        self._stages.apply(self.rung)

    def _is_check_step(self, step: int) -> bool:
        return step % self.check_every_n_steps == 0 and step != self._last_check

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_started = time.perf_counter()
        if self._stages is not None and self._stages.stages is None:
            # The first step runs every unit plainly and measures them: stages and bytes freed.
            self._step_started = None  # a profiling step's time is not a rung's
            self._profile = self._stages.profile(exclude=pl_module.parameters(), record=TRIAL_SAMPLES)
            self._profile.__enter__()
            return
        # global_step counts optimizer steps: this batch ends at global_step + 1.
        if self.probe is None or self.probe.measures_own or not self._is_check_step(trainer.global_step + 1):
            return  # a probe that measures the job itself needs no meter on the step
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self._device)
        else:
            self._meter = SavedTensorMeter(exclude=pl_module.parameters()).__enter__()

    @override
    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        self._stop_meters()

    def _stop_meters(self) -> None:
        if self._profile is not None:
            self._profile.__exit__(None, None, None)
            if self._measured_profile:
                self._job_peak = self._profile.meter.bytes
            self._profiled, self._profile = self._profile, None  # finished after the step
        if self._meter is not None:
            self._meter.__exit__(None, None, None)
            self._job_peak, self._meter = self._meter.bytes, None

    def _finish_profile(self, profile: UnitProfile, world_size: int = 1) -> None:
        assert self._stages is not None
        failed = self._failed_trials(profile, world_size)
        if failed:
            self._stages.remove(failed)
        stages = profile.stages(drop=failed)
        if not stages:
            rank_zero_warn(
                "AdaptiveBandLimit: no unit is exact when checkpointed; the ladder is the compression alone"
            )
            self._stages = None
            self.controller.set_rungs(0)
            self.rung = 0
            return
        self._stages.set_stages(stages)
        if self._measured_profile:
            savings = profile.savings(drop=failed)
            self.controller.set_stage_savings(savings)
            self.rung = min(self.rung, len(stages))
            freed = f"bytes each frees: {[f'{s / 2**20:.1f} MiB' for s in savings]}"
        else:  # measured with every unit checkpointed, after an out-of-memory error: on the top rung
            self.controller.set_rungs(len(stages))
            self.rung = len(stages)
            self._stages.apply(self.rung)
            if self._oom_while_profiling is not None:
                self._record_oom(self._oom_while_profiling, units=self._units_at(self.rung))
                self._oom_while_profiling = None
            freed = "bytes each frees: unknown (measured checkpointed, after an out-of-memory error)"
        on_top = "compression" in self.levers and (
            self.continuum_rung == "top" or (self.continuum_rung == "auto" and self._stages.keep_spectrum())
        )
        self.controller.set_continuum_on_top(on_top)
        continuum = (
            "the compression continuum runs on the top rung (checkpointed blocks keep their kept spectrum)"
            if on_top
            else "the compression continuum runs on rung 0"
        )
        rank_zero_info(
            f"AdaptiveBandLimit: {len(stages)} checkpointing rungs over {sum(map(len, stages))} units "
            f"(stages, highest resolution first: {stages}); {freed}; {continuum}"
        )

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._stop_meters()  # the step ended without a backward (e.g. skipped)
        if self._profiled is not None:
            profile, self._profiled = self._profiled, None
            self._finish_profile(profile, trainer.world_size)
        if self._step_started is not None and self.compression <= self.controller.min_compression:
            message = self.controller.observe_time(self.rung, time.perf_counter() - self._step_started)
            if message is not None:
                rank_zero_info(f"AdaptiveBandLimit: {message}")
        self._step_started = None
        if self._stages is not None and self.compression > 0 and self.controller.continuum_on_top:
            self._fallbacks(self._stages, self.compression)  # units kept in full at this compression
        self._check(trainer, pl_module)
        if self._stages is not None and self._stages.stages is not None and self._stages.rung != self.rung:
            self._stages.apply(self.rung)  # between optimizer steps
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # logs the outcome

    @override
    def _should_log(self, trainer: pl.Trainer) -> bool:
        return super()._should_log(trainer) or self._last_check == trainer.global_step

    def _check(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.probe is None or not self._is_check_step(trainer.global_step):
            return
        self._last_check = trainer.global_step
        try:
            reading = self.probe.read()
        except ProbeUnavailable as error:
            rank_zero_warn(
                f"AdaptiveBandLimit: the memory probe stopped working ({error}); the levers stay as they are"
            )
            self.probe = None
            return
        if reading.own is not None:  # the probe measured the job itself: learn what it counts
            peak = reading.own
        elif self._device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self._device)
        else:
            peak = self._job_peak
        if trainer.world_size > 1:
            reading, peak = agree_across_ranks(trainer.strategy, self.controller, reading, peak, self._device)
        ran = Setting(self._stages.rung if self._stages is not None else 0, self.compression)
        if peak:
            message = self.controller.observe(ran, float(peak))
            if message is not None:
                rank_zero_info(f"AdaptiveBandLimit: {message}")
        self._apply(trainer, pl_module, self.controller.decide(reading, self.setting), peak)

    def _apply(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, decision: Decision, peak: int | None
    ) -> None:
        previous = self.setting
        target = decision.setting
        if target != previous:
            self.compression, self.rung = target.compression, target.rung
            if target.compression > previous.compression or target.rung > previous.rung:
                release_cached_memory(self._device)  # so the device (and NVML) sees the memory freed
            changes = []
            if target.rung != previous.rung:
                changes.append(
                    f"rung {previous.rung} -> {target.rung} "
                    f"({self._units_at(target.rung)} units checkpointed)"
                )
            if target.compression != previous.compression:
                changes.append(f"compression {previous.compression:.3f} -> {target.compression:.3f}")
            rank_zero_info(
                f"AdaptiveBandLimit: step {trainer.global_step}: {', '.join(changes)} ({decision.reason}: "
                f"{decision.free / 2**20:.0f} MiB free, threshold {decision.threshold / 2**20:.0f} MiB)"
            )
        record = decision_record(
            trainer.global_step,
            self.rung,
            self._units_at(self.rung),
            self.compression,
            decision.reason,
            decision.free,
            peak,
            self.controller.slowdown(self.rung),
        )
        self.decisions.append(record)
        log_decision(pl_module, type(self).__name__, record)

    def _failed_trials(self, profile: UnitProfile, world_size: int = 1) -> list[str]:
        """The units that are not exact when checkpointed (:func:`~lightning_bandlimit.recompute.trial.trial`
        on the profile's recorded samples, at the compression now and, when the compression lever
        may raise it, at a band-limiting one); one warning names them. Under DDP a unit that fails
        on any rank leaves the ladder on every rank (the ranks' units may differ: names are
        gathered, one collective)."""
        assert self._stages is not None
        compressions: list[float | None] = [None]
        if "compression" in self.levers and self.controller.max_compression > self.compression:
            compressions.append(max(self.compression, min(0.5, self.controller.max_compression)))
        reasons: dict[str, str] = {}
        for name, args in profile.inputs.items():
            for compression in compressions:
                reason = trial(name, self._stages.units[name], args, compression)
                if reason is not None:
                    reasons[name] = (
                        reason if compression is None else f"{reason} (at compression {compression})"
                    )
                    break
        profile.inputs.clear()
        if world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            gathered: list[list[str] | None] = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, sorted(reasons))
            for name in sorted({n for names in gathered for n in names or ()} - set(reasons)):
                if name in self._stages.units:
                    reasons[name] = f"{name}: not exact when checkpointed on another rank"
        if reasons:
            rank_zero_warn(
                f"AdaptiveBandLimit: {len(reasons)} of {len(self._stages.units)} units are not exact when "
                f"checkpointed and leave the ladder: {'; '.join(reasons.values())}"
            )
        return list(reasons)

    def _units_at(self, rung: int) -> int:
        stages = self._stages.stages if self._stages is not None else None
        return sum(len(stage) for stage in stages[:rung]) if stages else 0

    def _recover_from_oom(self, trainer: pl.Trainer) -> None:
        """An out-of-memory error in ``training_step``: move to a setting that needs less memory
        before the batch runs again (:func:`~.out_of_memory.guard_training_step`)."""
        profiling = self._profile is not None
        if profiling:  # the profile is incomplete: measure the units again, checkpointed
            self._profile.__exit__(None, None, None)
            self._profile = None
        self._stop_meters()
        self._job_peak = None  # the failed attempt's, not the retry's
        free_memory(self._device)
        previous = self.setting
        if profiling:
            assert self._stages is not None
            self._measured_profile = False
            self._profile = self._stages.profile(checkpointed=True).__enter__()
            rank_zero_warn(
                f"AdaptiveBandLimit: out of memory in training_step at step {trainer.global_step} "
                "(the first, which measures the units); retrying the batch once with every unit "
                "checkpointed"
            )
            self._oom_while_profiling = trainer.global_step  # kept once the retry measured the stages
            return
        retry = self.controller.on_oom(previous)
        self.compression, self.rung = retry.compression, retry.rung
        if self._stages is not None and self._stages.stages is not None:
            self._stages.apply(self.rung)
        rank_zero_warn(
            f"AdaptiveBandLimit: out of memory in training_step at step {trainer.global_step}; "
            f"retrying the batch once at rung {self.rung}, compression {self.compression:.3f} "
            f"(was rung {previous.rung}, compression {previous.compression:.3f})"
        )
        self._record_oom(trainer.global_step, units=self._units_at(self.rung))

    def _record_oom(self, step: int, units: int) -> None:
        self.decisions.append(decision_record(step, self.rung, units, self.compression, OOM))

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self._stop_meters()
        if self._stages is not None:
            self._stages.release()  # the user's model as it was; a next fit re-applies the rung
            self._stages = None
        if self._guarded is not None:
            unguard_training_step(self._guarded)
            self._guarded = None
        if self.probe is not None and self._probe_spec == "auto":
            self.probe.close()
            self.probe = None

    @override
    def state_dict(self) -> dict[str, Any]:
        stages = self._stages.stages if self._stages is not None else None
        return {
            **super().state_dict(),
            "rung": self.rung,
            "stages": stages,
            "controller": self.controller.state_dict(),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        controller = dict(state_dict.get("controller", {}))
        if "checkpoint" not in self.levers:
            controller["rungs"], state_dict = 0, {**state_dict, "rung": 0, "stages": None}
        self.rung = int(state_dict.get("rung", 0))
        self._saved_stages = state_dict.get("stages")
        self.controller.load_state_dict(controller)


def _check_levers(levers: Sequence[str]) -> tuple[str, ...]:
    if isinstance(levers, str) or not isinstance(levers, Sequence):
        raise TypeError(f"levers must be a sequence of lever names from {list(LEVERS)}, got {levers!r}")
    unknown = [lever for lever in levers if lever not in LEVERS]
    if unknown or not levers:
        raise ValueError(f"levers must be a non-empty selection of {list(LEVERS)}, got {list(levers)}")
    return tuple(lever for lever in LEVERS if lever in levers)
