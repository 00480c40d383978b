"""``AdaptiveBandLimit``: move a job's levers (checkpointing, micro-batch split, compression) with
the device's free memory. The callback is Lightning's hooks and the one owner of the setting the
job runs at (``_move_to``); beside it: ``ladder_stages`` (exact rungs), ``ladder_profile`` (the
first step, which measures them), ``ladder_splits`` (the micro-batch lever), ``ladder_check``
(when a check runs; read, agree, decide) over ``ladder_reading``, ``ladder_step_peak`` and
``ladder_drift`` (what a check reads), ``ladder_agreement`` (the ranks' agreement),
``ladder_records`` (what it records and logs) and ``ladder_coordinator`` (what decides beside the
ladder), ``ladder_events`` (the controller's one feeder), ``ladder_backstop`` (the
out-of-memory backstop) and ``ladder_state`` (what its checkpoint holds, and how a resumed job
reads it back)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_bandlimit.callbacks.band_limit import BandLimit
from lightning_bandlimit.callbacks.ladder_backstop import OutOfMemoryBackstop
from lightning_bandlimit.callbacks.ladder_check import LadderCheck
from lightning_bandlimit.callbacks.ladder_coordinator import Coordinator
from lightning_bandlimit.callbacks.ladder_events import LadderEvents
from lightning_bandlimit.callbacks.ladder_profile import FirstStep
from lightning_bandlimit.callbacks.ladder_reading import JobMemory
from lightning_bandlimit.callbacks.ladder_records import decision_record, describe_change, log_decision
from lightning_bandlimit.callbacks.ladder_splits import GHOST_BATCH, SplitLever
from lightning_bandlimit.callbacks.ladder_stages import ExactRungs
from lightning_bandlimit.callbacks.ladder_state import ladder_state, restore_ladder
from lightning_bandlimit.callbacks.ladder_step_peak import StepPeak
from lightning_bandlimit.ladder.controller import LadderController
from lightning_bandlimit.ladder.reasons import OOM
from lightning_bandlimit.ladder.setting import Decision, Setting
from lightning_bandlimit.layers.batchnorm import Forward
from lightning_bandlimit.layers.surgery import Patterns, normalize_patterns
from lightning_bandlimit.memory.probes import auto_probe
from lightning_bandlimit.memory.process import release_cached_memory
from lightning_bandlimit.memory.protocol import MemoryProbe
from lightning_bandlimit.utils.validation import check_choice, check_compression, check_int, check_selection

LEVERS = ("checkpoint", "microbatch", "compression")
CONTINUUM_RUNGS = ("auto", "top", "zero")
RUNG_ORDERS = ("cost", "pointwise", "stages")

__all__ = ["AdaptiveBandLimit"]


class AdaptiveBandLimit(BandLimit):
    """Keep a job fitting beside other tenants: exact levers first, the spectral cutoff last.

    Every ``check_every_n_steps`` training steps it reads the free memory of the job's device
    (NVML: the whole device, other processes included; else ``torch.cuda.mem_get_info``; on CPU
    the host's available memory and cgroup limit) and lets a
    :class:`~lightning_bandlimit.ladder.LadderController` choose a point on a ladder of levers,
    least lossy first:

    1. **Activation checkpointing** (``"checkpoint"`` lever; exact gradients) of the model's
       residual-block-like units (:func:`~lightning_bandlimit.recompute.unit_choice.checkpoint_units`,
       or ``checkpoint_units`` patterns): by default the rungs take the cheapest bytes first, a
       unit or a few per rung, by bytes freed per second of recompute measured on the first step
       (``rung_order``; ``"pointwise"`` adds each unit's pointwise mode, keeping its
       convolutions' outputs, before its full one; :mod:`lightning_bandlimit.recompute.plan`),
       else by stages. Units are switched between optimizer steps, in place (``state_dict`` keys
       unchanged), in the non-reentrant mode (DDP-safe), with BatchNorm running statistics
       updated once per step.
    2. **Micro-batch split** (``"microbatch"`` lever; exact for a per-sample mean loss without
       batch-dependent layers): on the top rung, each step's batch runs in 2, 4, ... up to
       ``max_split`` chunks whose gradients accumulate before one optimizer step
       (:mod:`lightning_bandlimit.microbatch`; the global batch is kept). Tried on the first
       batch in training mode, against the whole batch's gradient; a step that is not exact split
       (a summed loss, in-batch negatives) leaves it off, said once. With BatchNorm in training
       mode each chunk is normalised by its own statistics (ghost batches): the split is then
       approximate, and used only while its chunks keep at least ``ghost_batch`` samples; the
       decisions say ``"exact"``, ``"ghost"`` or ``"lossy"`` (``exactness``).
    3. **Compression** (``"compression"`` lever; lossy): the band-limited layers' compression,
       raised above ``min_compression`` only when the exact levers do not suffice (at the
       largest split). When every unit is a block whose input reaches its arithmetic only through band-limited
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
    memory of each point is learned from the job's own peak per check (the probe's measurement
    of the job, :class:`~lightning_bandlimit.memory.SharedBudgetProbe`; else
    ``torch.cuda.max_memory_allocated``; else bytes saved for backward), as the step's increment
    over what the job held at the step's start where that is measured, so the job's own growth
    between steps (a cache filling) does not count against a rung; that growth is logged
    (``.../baseline_bytes``) and said once when it exceeds ``min_free``; a rung not visited yet
    is predicted to free nothing (what its stages keep for backward, measured in the first
    step, only hints which to try first). ``max_slowdown`` caps each rung's measured step time.

    ``levers=["compression"]``: compression only; ``levers=["checkpoint", "microbatch"]``: exact
    only (no compression above ``min_compression``). A model without checkpointable units (e.g. a
    plain ``nn.Sequential`` chain) has no exact rungs: the splits and the compression remain
    (said once).

    Like :class:`BandLimit` it swaps the convolutions in ``setup`` when the model has none
    band-limited, and keeps its state in checkpoints: the setting (compression, rung, split), the
    stages, the micro-batch trial's outcome (a resumed job does not try again; a restored split
    the outcome does not allow falls back to the largest it allows below it, or 1, said once) and
    what the controller learned (memory and times).

    Logged per check: ``AdaptiveBandLimit/rung``, ``.../checkpointed_units``, ``.../split``,
    ``.../compression``, ``.../achieved_compression``, ``.../free_bytes``,
    ``.../job_peak_bytes``, ``.../baseline_bytes`` (what the job held at its measured step's
    start), ``.../slowdown`` (the rung's measured step time over rung 0's) and ``.../decision``
    (-1 lower, 0 hold, 1 raise, 2 out-of-memory retry); every change is also
    reported with its reason and kept in :attr:`decisions`. Under DDP all ranks apply the most
    conservative point any rank asks for, on the same step.

    **What it guarantees, and what it does not** (README, "Keep fitting beside other jobs"): a
    co-tenant whose memory grows by less than ``min_free`` between two checks is met before the
    job overdraws, as far as the levers can free and the memory model predicts; memory no lever
    frees, a faster co-tenant, or an out-of-memory error in ``backward`` it cannot help.

    **Out-of-memory backstop** (``oom_backstop=True``, single-process runs;
    :mod:`~lightning_bandlimit.callbacks.ladder_backstop`): an out-of-memory error raised inside
    ``training_step`` moves to the top rung (there, to its largest split, then the continuum; in
    the first step, every unit checkpointed) and retries that batch once; an OOM in ``backward``,
    the optimizer step or another process it cannot catch, a second one on the batch propagates.

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
        levers: which levers the ladder may use: ``"checkpoint"``, ``"microbatch"``, ``"compression"``.
        checkpoint_units: glob patterns over module names choosing the units to checkpoint
            (default: found automatically).
        rung_order: ``"cost"``: rungs by bytes freed per second of recompute, measured on the
            first step; ``"pointwise"``: the same, with each unit's pointwise mode as a move
            before its full one; ``"stages"``: rung ``r`` checkpoints the first ``r`` stages in
            full.
        max_slowdown: the most step time a checkpointing rung may cost relative to none
            (e.g. ``1.3``); ``None``: no cap.
        max_split: the most chunks the micro-batch lever runs a step's batch in (``1``: none).
        ghost_batch: the fewest samples a chunk keeps when the split is a ghost-batch split
            (BatchNorm in training mode; default 32: ghost batches of 32 or more are a known,
            usually benign regime, Hoffer et al. 2017, while below 8-16 samples BatchNorm's error
            grows fast, Wu and He 2018). A batch too small for two such chunks leaves the lever off.
        continuum_rung: where the compression rises past the exact rungs: ``"auto"`` (the top
            rung when every unit keeps its kept spectrum when checkpointed, else rung 0),
            ``"top"`` or ``"zero"``. On the top rung the checkpointed blocks shrink with the
            compression too (far fewer bytes saved for backward) at the recompute's step time;
            a step's peak is often set by the backward's own working set, and then rung 0 at
            the same compression needs about as much memory and runs faster (README,
            "Checkpointed band-limited blocks").
        include, exclude, pointwise, memory_lean, recalibrate_bn, bn_forward: as
            :class:`BandLimit`'s (``memory_lean`` is on by default: it is what makes a higher
            compression free memory).
        **controller_kwargs: further :class:`~lightning_bandlimit.ladder.LadderController`
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
        (0.0, 0, ('checkpoint', 'microbatch', 'compression'))
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
        rung_order: str = "cost",
        max_slowdown: float | None = None,
        max_split: int = 8,
        ghost_batch: int = GHOST_BATCH,
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
        levers = check_selection("levers", levers, LEVERS)
        check_choice("continuum_rung", continuum_rung, CONTINUUM_RUNGS)
        check_choice("rung_order", rung_order, RUNG_ORDERS)
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
        check_int("max_split", max_split, minimum=1)
        check_int("ghost_batch", ghost_batch, minimum=2)  # one sample has no variance
        if not (isinstance(probe, MemoryProbe) or probe == "auto"):
            error = ValueError if isinstance(probe, str) else TypeError
            raise error(f"probe must be 'auto' or a MemoryProbe, got {probe!r}")
        self.levers = levers
        self.max_split = max_split
        self.ghost_batch = ghost_batch
        self._splits = (
            SplitLever(max_split, ghost_batch) if "microbatch" in levers and max_split > 1 else None
        )
        self.continuum_rung = continuum_rung
        self.checkpoint_units = normalize_patterns("checkpoint_units", checkpoint_units)
        self.check_every_n_steps = check_every_n_steps
        self._probe_spec = probe
        self.probe: MemoryProbe | None = probe if isinstance(probe, MemoryProbe) else None
        self.oom_backstop = oom_backstop
        self.decisions: list[dict[str, Any]] = []
        self._events = LadderEvents(self.controller)  # the one place the controller is changed
        self._rungs = ExactRungs(None, order=rung_order)
        self._first_step = FirstStep(self._rungs, self._events, continuum_rung)
        self._backstop = OutOfMemoryBackstop()
        self._peak = StepPeak()
        self._checks = LadderCheck(type(self).__name__, check_every_n_steps)
        self._device: torch.device | None = None
        self._step_started: float | None = None
        self.coordinator: Coordinator | None = None

    @property
    def rung(self) -> int:
        """The rung the job runs at (checkpointed stages); setting it moves the job there."""
        return self._rungs.rung

    @rung.setter
    def rung(self, rung: int) -> None:
        self._move_to(replace(self.setting, rung=rung))

    @property
    def split(self) -> int:
        """The chunks a training step's batch runs in (``1``: whole)."""
        return 1 if self._splits is None else self._splits.split

    @property
    def _ghost(self) -> bool:
        """Whether the micro-batch lever's splits are ghost-batch splits (approximate)."""
        outcome = None if self._splits is None else self._splits.outcome
        return outcome is not None and outcome.ghost

    @property
    def setting(self) -> Setting:
        """The ladder point the job runs at: checkpointed stages (rung), compression and split."""
        return Setting(self.rung, self.compression, split=self.split)

    def _move_to(self, setting: Setting) -> None:
        """The one place the applied setting changes: the band-limited layers' compression, the
        rung (the units are switched to it once the stages are known; until then it is held) and
        the split (without the micro-batch lever it stays 1)."""
        self.compression = setting.compression
        self._rungs.rung = setting.rung
        if self._splits is not None:
            self._splits.split = setting.split

    @property
    def checkpointed_units(self) -> list[str]:
        """Names of the units checkpointed now."""
        return self._rungs.checkpointed()

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._device = trainer.strategy.root_device
        if self.probe is None and self._probe_spec == "auto":
            self.probe = auto_probe(self._device)  # warns once itself when it falls back or gives up
        if stage == "fit" and "checkpoint" in self.levers and self._rungs.stages is None:
            self._rungs.find(pl_module, self.checkpoint_units)
        if stage == "fit" and self._splits is not None:
            self._splits.install(trainer, pl_module)
        if stage == "fit" and self.oom_backstop:
            self._backstop.install(trainer, pl_module, lambda: self._recover_from_oom(trainer))

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._rungs.stages is None:  # no units (or no checkpoint lever): a saved ladder does not apply
            self._rungs.saved_stages = None
            self._events.stages_measured(rungs=0)
            self._move_to(replace(self.setting, rung=0))
        elif (restored := self._rungs.restore()) is False:  # the saved stages name other units
            self._events.stages_measured(rungs=0)
        elif restored:  # resumed: no profiling step, the saved rung (at most the top)
            self._move_to(replace(self.setting, rung=min(self.rung, self.controller.top)))
        if self._splits is None:  # no lever: a saved ladder's splits do not apply
            self._events.splits_chosen(())
        elif self._splits.tried:  # tried before (a second fit, or restored): no trial, its splits
            self._events.splits_chosen(self._splits.ladder(self.controller.splits))

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_started = time.perf_counter()
        if self._splits is not None:
            self._splits.start_step(batch, batch_idx)
        if self._first_step.pending:
            # The first step runs every unit plainly and measures them: stages and bytes freed.
            self._step_started = None  # a profiling step's time is not a rung's
            on_top = self.coordinator is not None and self.coordinator.first_step_on_top()  # beside peers
            self._first_step.start(pl_module.parameters(), on_top)
            return
        # global_step counts optimizer steps: this batch ends at global_step + 1.
        if self.probe is None or self.probe.measures_own or not self._checks.due(trainer.global_step + 1):
            return  # a probe that measures the job itself needs no meter on the step
        self._peak.start(self._device, exclude=pl_module.parameters())

    @override
    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: torch.Tensor
    ) -> None:
        if self._splits is not None and self._splits.in_chunk:
            return  # a chunk before the step's last: its peak is the step's, metered to the last
        self._stop_meters()

    def _stop_meters(self) -> None:
        self._peak.stop(self._first_step.close())  # a profiling step's peak, finished after the step

    def _finish_profile(self, world_size: int) -> None:
        """The stages the first step measured go to the controller; the job moves to its rung."""
        end = self._first_step.finish(self.setting, self._peak, world_size)
        self._move_to(replace(self.setting, rung=end.rung))
        if end.oom_step is not None:
            self._record(end.oom_step, OOM)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._stop_meters()  # the step ended without a backward (e.g. skipped)
        if self._first_step.profiling is not None:
            self._finish_profile(trainer.world_size)
        if self._step_started is not None and self.compression <= self.controller.min_compression:
            self._events.step_timed(self.rung, time.perf_counter() - self._step_started, self.split)
        self._step_started = None
        if self._splits is not None:
            self._splits.end_step()
            if (splits := self._splits.try_splits(trainer, pl_module)) is not None:
                self._events.splits_chosen(splits)
                # a split applied before the trial (an older checkpoint's) must be one it allows
                self._move_to(replace(self.setting, split=self._splits.restore_split(self.split)))
        if self.compression > 0 and self.controller.continuum_on_top:
            self._rungs.report_fallbacks(self.compression)  # units kept in full at this compression
        self._check(trainer, pl_module)  # a new rung applies here, between optimizer steps
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # logs the outcome

    @override
    def _should_log(self, trainer: pl.Trainer) -> bool:
        return super()._should_log(trainer) or self._checks.last == trainer.global_step

    def _check(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Read, agree across ranks, decide (:class:`~.ladder_check.LadderCheck`), apply."""
        ddp = trainer.world_size > 1  # a rank without a reading still meets the others' collective
        if (self.probe is None and not ddp) or not self._checks.due(trainer.global_step):
            return
        self._checks.last = trainer.global_step
        read = None if self.probe is None else self._read()
        checked = self._checks.decide(
            trainer, self, self.setting, read, self._events, self.coordinator, self._device
        )
        if checked is not None:
            self._apply(trainer, pl_module, *checked)

    def _read(self) -> JobMemory | None:
        """The check's reading; after ``PROBE_FAILURES_TO_STOP`` failures in a row, read no more."""
        read = self._checks.read(self.probe, self._device, self._peak)  # type: ignore[arg-type]
        if self._checks.reader.stopped:
            self.probe = None
        return read

    def _apply(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        decision: Decision,
        peak: int | None,
        base: int | None = None,
    ) -> None:
        previous = self.setting
        target = decision.setting
        if target != previous:
            self._move_to(target)
            if target.compression > previous.compression or target.rung > previous.rung or target.split > 1:
                release_cached_memory(self._device)  # so the device (and NVML) sees the memory freed
            change = describe_change(
                trainer.global_step, previous, decision, self._rungs.units_at(target.rung), self._ghost
            )
            rank_zero_info(f"AdaptiveBandLimit: {change}")
        slowdown = self.controller.slowdown(self.rung, self.split)
        record = self._record(trainer.global_step, decision.reason, decision.free, peak, slowdown, base)
        log_decision(pl_module, type(self).__name__, record)

    def _record(self, step: int, reason: str, *fields: Any) -> dict[str, Any]:
        """Keep a check's (or an out-of-memory retry's) record of the setting applied now."""
        units = self._rungs.units_at(self.rung)
        record = decision_record(
            step, self.rung, units, self.compression, reason, *fields, split=self.split, ghost=self._ghost
        )
        self.decisions.append(record)
        return record

    def _recover_from_oom(self, trainer: pl.Trainer) -> None:
        """An out-of-memory error in ``training_step``: move to a setting that needs less memory
        before the batch runs again (:class:`~.ladder_backstop.OutOfMemoryBackstop`)."""
        self._stop_meters()
        self._peak.bytes = None  # the failed attempt's, not the retry's
        step = trainer.global_step
        retry = self._backstop.retry_setting(step, self.setting, self._first_step, self._events, self._device)
        if retry is not None:  # None: the first step measures the units again, checkpointed
            self._move_to(retry)
            self._record(step, OOM)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        self._stop_meters()
        self._first_step.release()
        self._rungs.release()  # the user's model as it was; the rung and the stages stay known
        if self._splits is not None:
            self._splits.remove()
        self._backstop.remove()
        if self.probe is not None and self._probe_spec == "auto":
            self.probe.close()
            self.probe = None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            **ladder_state(self.setting, self._rungs, self._splits, self.controller),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # BandLimit's load_state_dict restores the compression alone; here it is part of the
        # setting, restored with the rung and the split by the one move.
        restored = restore_ladder(
            state_dict, self.levers, self._rungs, self._splits, self._events, self.compression
        )
        self._move_to(restored)
