"""What one job of the multi-tenant scenario is and what it measured: :class:`JobSpec` and
:class:`JobResult`, the two records that cross the process boundary as JSON (``spec.json`` into
a job's process, ``result.json`` back out of it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_bandlimit.memory.cotenant import RampTrace
from lightning_bandlimit.utils.validation import check_choice, check_int

__all__ = ["JobResult", "JobSpec"]

Mode = Literal["plain", "checkpointed", "fixed", "adaptive"]
MODES = ("plain", "checkpointed", "fixed", "adaptive")


@dataclass
class JobSpec:
    """One job of the scenario.

    Args:
        name: the job's name (folder and legend).
        mode: ``"plain"``, ``"checkpointed"``, ``"fixed"`` or ``"adaptive"``.
        out_dir: where its checkpoints, logs and ``result.json`` go.
        trace: the co-tenant's trace, as :class:`RampTrace` fields.
        recipe: recipe name or config path.
        overrides: extra LightningCLI arguments.
        compression: ``fixed``: the compression; ``adaptive``: its floor (and start); ``None``:
            the recipe's ``BandLimit`` compression (0.5 if it has none).
        max_compression: ``adaptive``: its ceiling.
        budget: bytes shared with the co-tenant (``adaptive`` needs one).
        min_free: ``adaptive``: bytes of the budget to keep free.
        release_free: ``adaptive``: free bytes above which compression is given back.
        recalibrate_bn: ``fixed`` / ``adaptive``: training batches BatchNorm statistics are
            re-estimated over before each validation (``0``: off).
        levers: ``adaptive``: the levers (the ladder's three by default; ``["compression"]``:
            compression only).
        device: a folder the training jobs of one budget share (several jobs on one device):
            each registers its process there, and the others count against the budget as the
            co-tenant does, each at the larger of its resident set and its last step's peak (what
            a GPU's caching allocator holds; ``None``: the job is alone with its co-tenant).
        coordinate: ``adaptive`` with ``device``: ``True`` adds a
            :class:`~lightning_bandlimit.callbacks.SharedDevice` (one ladder across the jobs);
            ``False`` leaves each job's ladder on its own (independent).
        seed: the training seed (``--seed_everything``; ``None``: the recipe's).
        warm_data: load every training and validation example once before the first step (the
            datamodule's ``train_set`` and ``val_set``): a dataset that caches what it loads
            (the synthetic recipes') then holds it from the start, and the job's resident set
            moves with its step as a GPU job's device memory does (a dataset lives in host
            memory there), not with a cache filling through the first epoch.
        threads: the job's CPU threads (``torch.set_num_threads``; ``None``: torch's default,
            one per core): jobs that share a host's cores each take their share, not all of them.

    Raises:
        ValueError: for an unknown mode, an adaptive job without budget and thresholds, or
            ``threads`` below 1.
    """

    name: str
    mode: Mode
    out_dir: str
    trace: dict[str, Any]
    recipe: str = "quickstart"
    overrides: list[str] = field(default_factory=list)
    compression: float | None = None
    max_compression: float = 0.9
    budget: int | None = None
    min_free: int | None = None
    release_free: int | None = None
    recalibrate_bn: int = 8
    levers: list[str] = field(default_factory=lambda: ["checkpoint", "microbatch", "compression"])
    device: str | None = None
    coordinate: bool = False
    seed: int | None = None
    warm_data: bool = False
    threads: int | None = None

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, MODES)
        if self.threads is not None:
            check_int("threads", self.threads, minimum=1)
        if self.mode == "adaptive" and None in (self.budget, self.min_free, self.release_free):
            raise ValueError("an adaptive job needs budget, min_free and release_free (bytes)")
        RampTrace(**self.trace)  # checks the trace before any work


@dataclass
class JobResult:
    """What one job measured (all bytes are resident bytes, measured in ``/proc``)."""

    name: str
    mode: str
    val_accuracy: float
    final_compression: float
    achieved_compression: float
    compression_changes: int
    step_ms: float
    wall_s: float
    peak_job_bytes: int
    step_increment_bytes: int
    bn_recalibrations: int
    bn_recalibration_seconds: float
    checkpoint: str
    log_dir: str
    timeline: list[dict[str, Any]]
    rungs: int = 0
    rung_slowdowns: dict[str, float] = field(default_factory=dict)
