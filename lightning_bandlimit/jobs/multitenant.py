"""The multi-tenant scenario: a training job beside a co-tenant process, on a shared memory budget.

One job is one recipe trained in its own process (so its resident memory is its own) beside a
:class:`~lightning_bandlimit.memory.CoTenant` that follows a
:class:`~lightning_bandlimit.memory.RampTrace`, measured every step by a
:class:`~lightning_bandlimit.callbacks.SharedBudget`. A job is ``plain`` (the recipe with plain
``nn.Conv2d``: what the user would otherwise run), ``checkpointed`` (the plain model with every
checkpointable unit always checkpointed: what a user could do instead, no callback), ``fixed``
(band-limited at one compression) or ``adaptive`` (an
:class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` reading the budget, with the levers
its spec names). The job processes start with ``MALLOC_MMAP_THRESHOLD_=131072`` so that their resident
set follows their live tensors, as a GPU job's reserved memory does after ``empty_cache``;
the plain job runs under the same setting, so the comparison is like for like.

Used by the main job and ``benchmarks/multitenant.py``; ``python -m
lightning_bandlimit.jobs.multitenant SPEC.json`` runs one job (what :func:`launch` does).
"""

from __future__ import annotations

import atexit
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_bandlimit.callbacks.shared_budget import SharedBudget, over_budget_steps
from lightning_bandlimit.memory.cotenant import RampTrace
from lightning_bandlimit.utils.command_line import CommandLineError, debugging, exit_with_error
from lightning_bandlimit.utils.files import atomic_write_json
from lightning_bandlimit.utils.units import MIB
from lightning_bandlimit.utils.validation import check_choice, check_int, check_real

__all__ = [
    "JobResult",
    "JobSpec",
    "adaptive_thresholds",
    "budget_for",
    "launch",
    "launch_set",
    "over_budget",
    "plot_timelines",
    "run_job",
]

Mode = Literal["plain", "checkpointed", "fixed", "adaptive"]
MODES = ("plain", "checkpointed", "fixed", "adaptive")
HOST_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}
DWELL_S = 2.0  # a coordinated job waits this long after a peer's change (a few CPU steps)


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


def run_job(spec: JobSpec) -> JobResult:
    """Train ``spec``'s job in this process beside a co-tenant and measure it.

    Raises:
        FileNotFoundError: for an unknown recipe.
        CommandLineError: for overrides that do not parse or that the recipe's classes reject
            (a ``ValueError``; the message is the root cause, on one line).
    """
    from lightning_bandlimit.callbacks import AdaptiveBandLimit, BandLimit, StepTimer
    from lightning_bandlimit.jobs.cli import BandLimitCLI
    from lightning_bandlimit.recompute import stages, switch
    from lightning_bandlimit.utils.recipe_files import recipe_path

    out = Path(spec.out_dir)
    if spec.threads is not None:
        import torch

        torch.set_num_threads(spec.threads)
    cli = BandLimitCLI(
        args=[
            "--config",
            str(recipe_path(spec.recipe)),
            "--trainer.default_root_dir",
            str(out),
            "--trainer.logger",
            "lightning.pytorch.loggers.CSVLogger",
            "--trainer.logger.save_dir",
            str(out),
            "--trainer.logger.name",
            "",
            "--trainer.enable_progress_bar",
            "false",
            *([] if spec.seed is None else ["--seed_everything", str(spec.seed)]),
            *spec.overrides,
        ],
        run=False,
        usage_errors=True,
    )
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    recipe_bands = [cb for cb in trainer.callbacks if isinstance(cb, BandLimit)]
    template = recipe_bands[0] if recipe_bands else BandLimit()
    trainer.callbacks[:] = [cb for cb in trainer.callbacks if not isinstance(cb, BandLimit)]
    peers, publish = _register(spec) if spec.device is not None else (None, None)
    shared = SharedBudget(spec.budget, RampTrace(**spec.trace), peers=peers)
    trainer.callbacks.insert(0, shared)
    if publish is not None:
        trainer.callbacks.append(_PublishStepPeak(shared, publish))
    selection = {"include": template.include, "exclude": template.exclude, "pointwise": template.pointwise}
    band: BandLimit | None = None
    compression = template.compression if spec.compression is None else spec.compression
    if spec.mode == "fixed":
        band = BandLimit(compression, recalibrate_bn=spec.recalibrate_bn, **selection)
    elif spec.mode == "adaptive":
        band = AdaptiveBandLimit(
            compression=compression,
            min_compression=compression,
            max_compression=spec.max_compression,
            probe=shared.probe,
            min_free=spec.min_free,
            release_free=spec.release_free,
            check_every_n_steps=1,
            recalibrate_bn=spec.recalibrate_bn,
            levers=spec.levers,
            **selection,
        )
    elif spec.mode == "checkpointed":
        for _, unit in stages.checkpoint_units(model):
            switch.checkpoint(unit)
    if band is not None:
        trainer.callbacks.insert(1, band)
    if isinstance(band, AdaptiveBandLimit) and spec.device is not None and spec.coordinate:
        from lightning_bandlimit.callbacks import SharedDevice

        trainer.callbacks.append(SharedDevice(Path(spec.device) / "ledger", job=spec.name, dwell=DWELL_S))
    if spec.warm_data:
        trainer.callbacks.insert(0, _WarmData())
    timer = StepTimer()
    trainer.callbacks.append(timer)
    started = time.perf_counter()
    trainer.fit(model, datamodule=data)
    wall = time.perf_counter() - started
    timeline = shared.timeline
    decisions = band.decisions if isinstance(band, AdaptiveBandLimit) else []
    ladder = band.controller if isinstance(band, AdaptiveBandLimit) else None
    checkpoint = trainer.checkpoint_callback
    result = JobResult(
        name=spec.name,
        mode=spec.mode,
        val_accuracy=float(trainer.callback_metrics.get("val/acc", float("nan"))),
        final_compression=band.compression if band else 0.0,
        achieved_compression=(band.achieved_compression or 0.0) if band else 0.0,
        compression_changes=sum(a["compression"] != b["compression"] for a, b in zip(timeline, timeline[1:])),
        step_ms=timer.median_ms or float("nan"),
        wall_s=wall,
        peak_job_bytes=max(r["job_bytes"] for r in timeline),
        step_increment_bytes=int(statistics.median(r["job_bytes"] - r["start_bytes"] for r in timeline)),
        bn_recalibrations=band.bn_recalibrations if band else 0,
        bn_recalibration_seconds=band.bn_recalibration_seconds if band else 0.0,
        checkpoint=getattr(checkpoint, "last_model_path", "") or getattr(checkpoint, "best_model_path", ""),
        log_dir=str(trainer.log_dir),
        timeline=[{**r, "decision": None} for r in timeline],
        rungs=ladder.rungs if ladder is not None else 0,
        rung_slowdowns={
            str(r): ladder.slowdown(r) for r in sorted(ladder.rung_seconds) if ladder.slowdown(r) is not None
        }
        if ladder is not None
        else {},
    )
    for record in decisions:  # mark each step's decision in the timeline
        index = record["step"] - 1
        if 0 <= index < len(result.timeline):
            result.timeline[index]["decision"] = record["reason"]
    return result


def _register(spec: JobSpec) -> tuple[Callable[[], int], Callable[[int], None]]:
    """Register this job's process in ``spec.device``; returns ``(others, publish)``.

    ``others()`` measures the other jobs registered there as a GPU would count them: each at the
    larger of its resident set now and the peak of its last step (what a caching allocator keeps
    reserved between steps, and what NVML's per-process memory reports), so another job's phase
    within its step is not read as growth or release; a job that has exited counts nothing.
    ``publish(peak)`` records this job's last step peak for the others.
    """
    folder = Path(spec.device) / "processes"  # type: ignore[arg-type]
    folder.mkdir(parents=True, exist_ok=True)
    mine = folder / f"{spec.name}.json"
    pid = os.getpid()

    def publish(peak: int) -> None:
        atomic_write_json(mine, {"pid": pid, "step_peak": int(peak)})

    publish(0)
    atexit.register(mine.unlink, missing_ok=True)

    def others() -> int:
        return sum(max(resident, peak) for resident, peak in registered_memory(folder, skip=mine))

    return others, publish


def registered_memory(folder: Path, skip: Path | None = None) -> list[tuple[int, int]]:
    """``(resident set now, last step peak)`` of each job process registered in ``folder`` but
    ``skip``'s; an exited process or a half-written entry is left out."""
    from lightning_bandlimit.memory.process import resident_bytes

    found = []
    for path in folder.glob("*.json"):
        if path == skip:
            continue
        try:
            entry = json.loads(path.read_text())
            found.append((resident_bytes(int(entry["pid"])), int(entry["step_peak"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # gone, or being written
    return found


class _WarmData(Callback):
    """Loads every example of the datamodule's training and validation sets once, at setup."""

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for name in ("train_set", "val_set") if stage == "fit" else ():
            dataset = getattr(trainer.datamodule, name, None)
            if dataset is not None:
                for index in range(len(dataset)):
                    dataset[index]


class _PublishStepPeak(Callback):
    """After every training step, publish the job's step peak (``SharedBudget``'s) to its peers."""

    def __init__(self, shared: SharedBudget, publish: Callable[[int], None]) -> None:
        self.shared, self.publish = shared, publish

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.shared.timeline:
            self.publish(self.shared.timeline[-1]["job_bytes"])


def launch(spec: JobSpec, timeout: float | None = None) -> JobResult:
    """Run ``spec`` in a fresh process (see the module docstring) and return what it measured.

    Its output goes to ``<out_dir>/job.log``; ``<out_dir>/result.json`` holds the result.

    Raises:
        RuntimeError: if the job fails (the message ends with the log's tail).
    """
    return launch_set([spec], timeout=timeout)[0]


def launch_set(specs: list[JobSpec], stagger_s: float = 0.0, timeout: float | None = None) -> list[JobResult]:
    """Run the jobs ``specs`` at once, each in its own process (as :func:`launch`), the ``k``-th
    started ``k * stagger_s`` seconds after the first (several jobs on one device); returns
    their results in order.

    Raises:
        RuntimeError: if a job fails (the message ends with its log's tail).
        subprocess.TimeoutExpired: if a job runs past ``timeout`` seconds (all are stopped).
    """
    processes: list[subprocess.Popen] = []
    try:
        for k, spec in enumerate(specs):
            if k:
                time.sleep(stagger_s)
            processes.append(_start(spec))
        codes = [process.wait(timeout=timeout) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return [_result(spec, code) for spec, code in zip(specs, codes)]


def _start(spec: JobSpec) -> subprocess.Popen:
    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.json"
    atomic_write_json(spec_path, asdict(spec))
    with open(out / "job.log", "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "lightning_bandlimit.jobs.multitenant", str(spec_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **HOST_ALLOCATOR_ENV},
        )


def _result(spec: JobSpec, code: int) -> JobResult:
    out = Path(spec.out_dir)
    if code != 0 or not (out / "result.json").is_file():
        tail = "\n".join((out / "job.log").read_text().splitlines()[-20:])
        raise RuntimeError(
            f"the {spec.name!r} job failed (exit code {code}); the end of {out / 'job.log'}:\n{tail}"
        )
    return JobResult(**json.loads((out / "result.json").read_text()))


def _phase(result: JobResult, trace: RampTrace, hold: bool) -> list[dict[str, Any]]:
    steps = max(len(result.timeline), 1)
    rows = [
        r
        for i, r in enumerate(result.timeline)
        if (trace.start + trace.ramp <= i / steps < trace.leave) == hold
    ]
    return rows or result.timeline


def budget_for(plain: JobResult, trace: RampTrace, below: float = 0.25) -> int:
    """A budget the plain job does not fit beside the co-tenant's peak.

    ``below`` of the plain job's step increment (its peak minus its resident set at the start
    of a step, median) under the median of plain job + co-tenant while the co-tenant holds its
    peak: every compression that saves more than that fits, the plain job does not.

    Raises:
        ValueError: unless ``0 < below < 1``.
    """
    check_real("below", below, minimum=0, maximum=1, min_open=True, max_open=True)
    held = statistics.median(r["job_bytes"] + r["cotenant_bytes"] for r in _phase(plain, trace, hold=True))
    return int(held - below * plain.step_increment_bytes)


def over_budget(result: JobResult, budget: int) -> int:
    """Steps of ``result`` whose job peak plus co-tenant exceeded ``budget``."""
    return over_budget_steps(result.timeline, budget)


def adaptive_thresholds(plain: JobResult) -> tuple[int, int]:
    """``min_free`` and ``release_free`` for the adaptive job: 0.08 and 0.5 of the plain job's step memory."""
    return int(0.08 * plain.step_increment_bytes), int(0.5 * plain.step_increment_bytes)


def plot_timelines(results: list[JobResult], budget: int, path: Path, title: str = "") -> None:
    """Budget, job + co-tenant memory of each job, checkpointed units and compression, over the steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, middle, rungs, bottom) = plt.subplots(
        4, 1, figsize=(9, 9), sharex=True, height_ratios=[3, 1.2, 1.5, 1.5]
    )
    for result in results:
        steps = [r["step"] for r in result.timeline]
        top.plot(
            steps,
            [(r["job_bytes"] + r["cotenant_bytes"]) / MIB for r in result.timeline],
            label=f"{result.name} + co-tenant",
        )
        bottom.plot(steps, [r["compression"] for r in result.timeline], label=result.name)
        rungs.step(
            steps, [r.get("checkpointed_units", 0) for r in result.timeline], where="post", label=result.name
        )
    first = results[0].timeline
    middle.plot([r["step"] for r in first], [r["cotenant_bytes"] / MIB for r in first], color="grey")
    top.axhline(budget / MIB, color="red", ls="--", label="budget")
    top.set_ylabel("resident MiB\n(job's step peak + co-tenant)", fontsize=9)
    top.legend(fontsize=8, loc="upper left")
    middle.set_ylabel("co-tenant MiB", fontsize=9)
    rungs.set_ylabel("checkpointed\nunits (exact)", fontsize=9)
    rungs.legend(fontsize=8, loc="upper left")
    bottom.set_ylabel("compression\n(lossy)", fontsize=9)
    bottom.set_xlabel("training step")
    bottom.set_ylim(-0.05, 1)
    bottom.legend(fontsize=8, loc="upper left")
    if title:
        top.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _main(argv: list[str]) -> None:
    """``python -m lightning_bandlimit.jobs.multitenant SPEC.json``: a bad spec ends in one line, exit 2."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m lightning_bandlimit.jobs.multitenant",
        description="Run one job of the multi-tenant scenario (what launch() does).",
    )
    parser.add_argument("spec", type=Path, help="a JobSpec as JSON (launch() writes <out_dir>/spec.json)")
    path = parser.parse_args(argv).spec
    try:
        spec = JobSpec(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as error:  # unreadable, not JSON, a bad or unknown field
        if debugging():
            raise
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise exit_with_error(parser.prog, f"{path}: {reason}") from None
    try:
        result = run_job(spec)
    except (CommandLineError, FileNotFoundError) as error:  # bad overrides, no such recipe or data
        if debugging():
            raise
        raise exit_with_error(parser.prog, f"{path}: {error}") from None
    atomic_write_json(Path(spec.out_dir, "result.json"), asdict(result), indent=None)


if __name__ == "__main__":
    _main(sys.argv[1:])
