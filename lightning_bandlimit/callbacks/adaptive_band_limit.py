"""``AdaptiveBandLimit``: move the compression with the device's free memory."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.memory import garbage_collection_cuda, is_oom_error
from typing_extensions import override

from lightning_bandlimit.batchnorm import Forward
from lightning_bandlimit.callbacks.band_limit import BandLimit
from lightning_bandlimit.memory.controller import OOM, CompressionController, Decision
from lightning_bandlimit.memory.probes import MemoryProbe, ProbeUnavailable, auto_probe
from lightning_bandlimit.memory.process import release_cached_memory
from lightning_bandlimit.saved_tensors import SavedTensorMeter
from lightning_bandlimit.surgery import Patterns
from lightning_bandlimit.utils.validation import check_int

__all__ = ["AdaptiveBandLimit"]

_REASON_CODES = {"lower": -1.0, "hold": 0.0, "raise": 1.0, "oom": 2.0}


def _is_out_of_memory(error: BaseException) -> bool:
    if is_oom_error(error):
        return True
    # Lightning's test wants a one-argument RuntimeError naming CUDA or DefaultCPUAllocator; this
    # also catches host MemoryError, a CUDA OOM error raised with other arguments, other devices'
    # "out of memory" (MPS, XPU) and allocators' "can't allocate memory".
    if isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def _free_memory(device: torch.device | None) -> None:
    garbage_collection_cuda()  # gc.collect() and torch.cuda.empty_cache()
    if device is None or device.type != "cuda":
        release_cached_memory(device)  # the host's allocator too (malloc_trim), which Lightning leaves alone


class AdaptiveBandLimit(BandLimit):
    """Keep a job fitting beside other tenants by moving its band-limited layers' compression.

    Every ``check_every_n_steps`` training steps it reads the free memory of the job's device
    (NVML: the whole device, other processes included; else ``torch.cuda.mem_get_info``; on CPU
    the host's available memory and cgroup limit) and lets a
    :class:`~lightning_bandlimit.memory.CompressionController` decide: more compression when
    free memory drops below ``min_free`` (at once, jumping to the least compression its learned
    memory model predicts will fit), less when it stays above ``release_free`` (after
    ``release_checks`` calm checks and a cooldown, to the least compression predicted to keep
    ``release_free`` free). The memory model is learned online from the job's own peak per
    check: the probe's own measurement of the job when it has one
    (:class:`~lightning_bandlimit.memory.SharedBudgetProbe`: the resident set),
    ``torch.cuda.max_memory_allocated`` on GPU, else bytes saved for backward.

    Like :class:`BandLimit` it swaps the convolutions in ``setup`` when the model has none
    band-limited, keeps its state (compression and learned model) in checkpoints, and logs
    ``AdaptiveBandLimit/compression``, ``.../achieved_compression``, ``.../free_bytes``,
    ``.../job_peak_bytes`` and ``.../decision`` (-1 lower, 0 hold, 1 raise, 2 out-of-memory
    retry); every change is also reported with its reason and kept in :attr:`decisions`.
    Under DDP all ranks apply the most conservative (highest) compression any rank asks for,
    on the same step.

    **What it guarantees, and what it does not.** A co-tenant whose memory grows by less than
    ``min_free`` between two checks is met before the job overdraws: the check that sees free
    memory below ``min_free`` raises the compression for the next step, far enough to free the
    missing bytes plus the shortfall against its previous prediction (a co-tenant still
    growing), as far as ``max_compression`` can free and as far as its memory model predicts
    the saving right (measured beside a real co-tenant that overdrew the plain job's budget at
    28 of 96 steps: 0 over-budget steps in each of three seeds of ``benchmarks/multitenant.py``,
    with the co-tenant growing 8.4 MiB a step against a ``min_free`` of 12 MiB).
    It cannot help with memory compression does not free
    (parameters, optimizer state, the process's own base), a co-tenant that grows by more than
    ``min_free`` within one check interval (steps until the next check may overdraw), or an
    out-of-memory error in ``backward`` or another process. After a raise it returns cached
    memory to the device (``torch.cuda.empty_cache()``; glibc's ``malloc_trim`` on the host);
    on the host the resident set follows the tensors only with ``MALLOC_MMAP_THRESHOLD_`` set
    (glibc's default heap keeps its high-water mark whatever the compression).

    **Out-of-memory backstop** (``oom_backstop=True``, single-process runs): an out-of-memory
    error raised inside ``training_step`` (the forward pass) raises the compression and retries
    that batch once. It cannot catch an OOM in ``backward``, the optimizer step, data loading or
    another process; a second OOM on the same batch propagates. Under DDP it is off, since one
    rank retrying alone would desynchronise the collectives.

    Args:
        compression: starting compression (clamped into the bounds).
        min_free: free memory to keep: bytes, or a fraction of the total when below 1.
        release_free: free memory above which compression is given back (same unit).
        min_compression: lower bound.
        max_compression: upper bound.
        check_every_n_steps: training steps between two checks.
        probe: ``"auto"`` (best available, one warning on fallback) or a
            :class:`~lightning_bandlimit.memory.MemoryProbe`.
        oom_backstop: retry a batch whose forward ran out of memory, at a higher compression.
        include: glob patterns over module names to band-limit.
        exclude: glob patterns to leave alone.
        pointwise: also band-limit 1x1 convolutions.
        memory_lean: memory-lean training (see :class:`BandLimit`); on by default, since it is
            what makes a higher compression free memory.
        recalibrate_bn: BatchNorm follows the compression: before every validation (and at the
            end of an epoch or of training after a change) its running statistics are
            re-estimated over this many recent training batches (see :class:`BandLimit`); ``0``
            turns it off.
        bn_forward: how to run the model on a batch for that re-estimate (see :class:`BandLimit`).
        **controller_kwargs: further :class:`CompressionController` arguments (``raise_step``,
            ``lower_step``, ``release_checks``, ``cooldown_checks``, ``margin``).

    Raises:
        ValueError: for bounds, thresholds or steps out of range.

    Example:
        >>> from lightning_bandlimit.memory import ScriptedProbe
        >>> trace = ScriptedProbe(free=[900, 50, 50, 900], total=1000)  # a co-tenant comes and goes
        >>> callback = AdaptiveBandLimit(probe=trace, min_free=0.2, release_free=0.5, check_every_n_steps=1)
        >>> callback.compression
        0.0
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
        include: Patterns = None,
        exclude: Patterns = None,
        pointwise: bool = False,
        memory_lean: bool = True,
        recalibrate_bn: int = 8,
        bn_forward: Forward | None = None,
        **controller_kwargs: Any,
    ) -> None:
        self.controller = CompressionController(
            min_free=min_free,
            release_free=release_free,
            min_compression=min_compression,
            max_compression=max_compression,
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
            raise ValueError(f"probe must be 'auto' or a MemoryProbe, got {probe!r}")
        self.check_every_n_steps = check_every_n_steps
        self._probe_spec = probe
        self.probe: MemoryProbe | None = probe if isinstance(probe, MemoryProbe) else None
        self.oom_backstop = oom_backstop
        self.decisions: list[dict[str, Any]] = []
        self._meter: SavedTensorMeter | None = None
        self._job_peak: int | None = None
        self._device: torch.device | None = None
        self._guarded: pl.LightningModule | None = None
        self._last_check = -1

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._device = trainer.strategy.root_device
        if self.probe is None and self._probe_spec == "auto":
            self.probe = auto_probe(self._device)  # warns once itself when it falls back or gives up
        if stage == "fit" and self.oom_backstop:
            if trainer.world_size > 1:
                rank_zero_info(
                    "AdaptiveBandLimit: the out-of-memory backstop is off under multi-process training"
                )
            elif self._guarded is None:
                self._guard_training_step(trainer, pl_module)

    def _is_check_step(self, step: int) -> bool:
        return step % self.check_every_n_steps == 0 and step != self._last_check

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
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
        if self._meter is not None:
            self._meter.__exit__(None, None, None)
            self._job_peak, self._meter = self._meter.bytes, None

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._check(trainer, pl_module)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # logs the outcome

    @override
    def _should_log(self, trainer: pl.Trainer) -> bool:
        return super()._should_log(trainer) or self._last_check == trainer.global_step

    def _check(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._meter is not None:  # the step ended without a backward (e.g. skipped)
            self._meter.__exit__(None, None, None)
            self._meter = None
        if self.probe is None or not self._is_check_step(trainer.global_step):
            return
        self._last_check = trainer.global_step
        try:
            reading = self.probe.read()
        except ProbeUnavailable as error:
            rank_zero_warn(
                f"AdaptiveBandLimit: the memory probe stopped working ({error}); the compression stays fixed"
            )
            self.probe = None
            return
        if reading.own is not None:  # the probe measured the job itself: learn what it counts
            peak = reading.own
        elif self._device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self._device)
        else:
            peak = self._job_peak
        if peak:
            self.controller.model.observe(self.compression, float(peak))
        decision = self.controller.decide(reading, self.compression)
        agreed = float(
            trainer.strategy.reduce(
                torch.tensor(decision.compression, dtype=torch.float64, device=self._device), reduce_op="max"
            )
        )
        if agreed != decision.compression:
            self.controller.notify_change()  # another rank asked for more
        self._apply(
            trainer, pl_module, Decision(agreed, decision.reason, decision.free, decision.threshold), peak
        )

    def _apply(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, decision: Decision, peak: int | None
    ) -> None:
        previous = self.compression
        if decision.compression != previous:
            self.compression = decision.compression
            if decision.compression > previous:
                release_cached_memory(self._device)  # so the device (and NVML) sees the memory freed
            rank_zero_info(
                f"AdaptiveBandLimit: step {trainer.global_step}: compression {previous:.3f} -> "
                f"{decision.compression:.3f} ({decision.reason}: {decision.free / 2**20:.0f} MiB free, "
                f"threshold {decision.threshold / 2**20:.0f} MiB)"
            )
        record = {
            "step": trainer.global_step,
            "compression": self.compression,
            "reason": decision.reason,
            "free_bytes": decision.free,
            "job_peak_bytes": peak,
        }
        self.decisions.append(record)
        name = type(self).__name__
        pl_module.log(f"{name}/free_bytes", float(decision.free), on_step=True, on_epoch=False)
        pl_module.log(f"{name}/decision", _REASON_CODES[decision.reason], on_step=True, on_epoch=False)
        if peak:
            pl_module.log(f"{name}/job_peak_bytes", float(peak), on_step=True, on_epoch=False)

    def _guard_training_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        original = pl_module.training_step

        def training_step(*args: Any, **kwargs: Any) -> Any:
            failed = False
            try:
                return original(*args, **kwargs)
            except Exception as error:  # noqa: BLE001 - re-raised unless it is an OOM
                if not _is_out_of_memory(error):
                    raise
                failed = True  # recover outside the except: its traceback pins tensors
            if failed:
                _free_memory(self._device)
                previous = self.compression
                self.compression = self.controller.on_oom(previous)
                rank_zero_warn(
                    f"AdaptiveBandLimit: out of memory in training_step at step {trainer.global_step}; "
                    f"retrying the batch once at compression {self.compression:.3f} (was {previous:.3f})"
                )
                self.decisions.append(
                    {
                        "step": trainer.global_step,
                        "compression": self.compression,
                        "reason": OOM,
                        "free_bytes": None,
                        "job_peak_bytes": None,
                    }
                )
            return original(*args, **kwargs)

        pl_module.training_step = training_step  # type: ignore[method-assign]
        self._guarded = pl_module

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().teardown(trainer, pl_module, stage)
        if self._guarded is not None:
            del self._guarded.training_step  # back to the class's method
            self._guarded = None
        if self.probe is not None and self._probe_spec == "auto":
            self.probe.close()
            self.probe = None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "controller": self.controller.state_dict()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.controller.load_state_dict(state_dict.get("controller", {}))
