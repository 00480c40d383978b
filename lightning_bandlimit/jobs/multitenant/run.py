"""One job of the multi-tenant scenario trained in this process: :func:`run_job`.

The job's recipe is built through the command line's parser, its ``BandLimit`` replaced by what
the spec's mode asks (none, every unit checkpointed, a fixed compression or an
:class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit`), beside a
:class:`~lightning_bandlimit.callbacks.SharedBudget` that measures the job and its co-tenant
every step. With ``spec.device`` the job registers its process in that folder and publishes its
step peak there, so the other jobs of the device count it (:func:`registered_memory` reads the
folder); with ``spec.coordinate`` it joins their ledger through a
:class:`~lightning_bandlimit.callbacks.SharedDevice`.
"""

from __future__ import annotations

import atexit
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_bandlimit.callbacks.shared_budget import SharedBudget
from lightning_bandlimit.jobs.multitenant.spec import JobResult, JobSpec
from lightning_bandlimit.memory.cotenant import RampTrace
from lightning_bandlimit.utils.files import atomic_write_json

__all__ = ["registered_memory", "run_job"]

DWELL_S = 2.0  # a coordinated job waits this long after a peer's change (a few CPU steps)


def run_job(spec: JobSpec) -> JobResult:
    """Train ``spec``'s job in this process beside a co-tenant and measure it.

    Raises:
        FileNotFoundError: for an unknown recipe.
        CommandLineError: for overrides that do not parse or that the recipe's classes reject
            (a ``ValueError``; the message is the root cause, on one line).
    """
    from lightning_bandlimit.callbacks import AdaptiveBandLimit, BandLimit, StepTimer
    from lightning_bandlimit.jobs.cli import BandLimitCLI
    from lightning_bandlimit.recompute import switch, unit_choice
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
        for _, unit in unit_choice.checkpoint_units(model):
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
