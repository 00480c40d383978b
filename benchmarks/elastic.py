"""Elastic training: a fixed-size run against runs resized mid-way, per scaling rule.

On the synthetic 10-class task (``SyntheticImageDataModule``, ``ImageClassifier("small_cnn",
width=8, lr_schedule="samples")``: SGD, Nesterov momentum 0.9, a ``SampleSchedule`` with 20 %
warmup and cosine decay over the whole sample budget), every run trains on the same number of
samples (``--epochs`` x ``--train-size``) and is then validated once (``trainer.validate``,
logged ``val/acc``). Schedules of the number of processes (CPU, gloo, per-device batch
``--batch``):

* ``fixed``: one launch on 1 process for the whole budget (the reference).
* ``1-1-1``: the same, stopped and relaunched at the thirds without a resize: a control that
  the checkpoint-restart itself changes nothing (no rule applies; listed under ``none``).
* ``1-2-1``: the budget in thirds on 1, 2, 1 processes (the middle third at twice the global
  batch).
* ``1-4x-1``: the middle third on 2 processes with ``accumulate_grad_batches=2``, i.e. a scale
  of 4 simulated with accumulation (``KeepGlobalBatch`` chooses its own accumulation, so for it
  this schedule is 2 processes without accumulation, like ``1-2-1``).

Each resized schedule runs with every rule and with none: ``none`` (``NoScaling``: only data
position and schedule follow the resize), ``linear`` (``LinearScaling()``, 5-step re-warmup),
``keep-global-batch``, ``momentum`` (``MomentumAwareScaling()``) and ``adascale``
(``AdaScale()``). ``SquareRootScaling`` needs an Adam-family optimizer, so an ``adamw`` group
repeats ``fixed``, ``none`` and ``sqrt`` with the same model trained by AdamW and the same
``SampleSchedule``. All rules use library defaults and the same base LR (``--lr-sgd`` 0.1, the
model's default; ``--lr-adamw`` 1e-2, picked once on a seed-0 *fixed* run from 2e-3 / 5e-3 /
1e-2, which reached 60 / 72 / 77 %): nothing is tuned per rule. The stability guard is on (the
default) and its rollbacks are reported.

How a resize is run: every phase is a fresh ``python benchmarks/elastic.py --worker JSON``
process (Lightning starts the second rank), as a torchrun restart would be. A phase ends at a
fixed number of samples seen: a callback saves the checkpoint from ``on_train_batch_end`` right
after the optimizer step that reaches it (all ranks; mid-epoch) and stops; the next phase
resumes from it with ``trainer.fit(..., ckpt_path=...)``. Phase ends are the thirds of the
budget rounded to a multiple of the largest global batch, so every phase ends on an optimizer
step. Every run is checked to have seen exactly the planned number of samples and each training
sample exactly once per epoch (each rank records the indices of the images it trained on).
The first phase does not depend on the rule, so it runs once per optimizer and seed and every
resized run resumes from its checkpoint; its wall time is counted in every run's total. The
package is copied at the start and every launch imports that copy (the working tree may change
under a long run); each launch records a fingerprint of the sources it ran (``strategies``,
``models``, ``data``, ``callbacks``) and the benchmark stops if one differs from the copy's.

Determinism and cost: the seed sets ``seed_everything`` (model init, sampler order) and the data
module's seed. Images are rendered once per seed in the parent and handed to the workers (the
data module's cache is pre-filled), so a launch does not spend its time drawing images. Each
process uses one intra-op thread (``ElasticDDPStrategy(cpu_threads=1)``): on a shared 2-core
machine two threads per process are much slower under load, and one thread keeps the 1- and
2-process phases comparable. Wall time per run is the sum over its launches of the launch's wall
clock (process start to exit, including imports and process-group set-up), so a resized run
pays three start-ups against the fixed run's one.

Caveats for reading the result: with 3 seeds, differences of a few tenths of a point are within
seed noise (the table also gives the paired difference per seed, mean +- std); AdaScale
advances the schedule by its measured gain rather than by samples, so under a fixed *sample*
budget its cosine has not finished when the budget ends (its final schedule position is in the
JSON). When the stability guard rolls a resize back, the model, optimizer and schedule return
to their state at the resize but the data position and samples seen do not, so that run's
schedule ends behind its budget (final LR above the schedule's minimum; see ``final_lr``,
``schedule_progress`` and ``rollbacks`` per phase in the JSON).

Output: a table on stdout (optimizer x schedule x rule: val accuracy mean +- std over seeds, the
difference to the fixed run in points, whether it is within the 0.5-point target, wall time),
``benchmarks/results/elastic.json`` (configuration, versions, every per-seed, per-phase record,
the table) and ``elastic.png`` next to it (per optimizer, top: val accuracy mean +- std per rule
and schedule with the fixed run's mean as a line in a +-0.5-point band; bottom: the paired
difference to the fixed run of the same seed, mean +- std, against the band 0 +- 0.5).

Run from the repository root::

    # full run (3 seeds, ~20 min on 2 busy cores):
    PYTHONPATH=. .venv/bin/python benchmarks/elastic.py
    PYTHONPATH=. .venv/bin/python benchmarks/elastic.py --quick    # smoke run, ~1 minute
    PYTHONPATH=. .venv/bin/python benchmarks/elastic.py --seeds 0 --rules none linear --optimizers sgd
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUTPUT = REPO_ROOT / "benchmarks" / "results" / "elastic.json"
TARGET_POINTS = 0.5

# (devices, accumulate_grad_batches) per phase
SCHEDULES: dict[str, list[tuple[int, int]]] = {
    "fixed": [(1, 1)],
    "1-1-1": [(1, 1), (1, 1), (1, 1)],
    "1-2-1": [(1, 1), (2, 1), (1, 1)],
    "1-4x-1": [(1, 1), (2, 2), (1, 1)],
}
SGD_RULES = ("none", "linear", "keep-global-batch", "momentum", "adascale")
ADAM_RULES = ("none", "sqrt")
ALL_RULES = ("none", "linear", "keep-global-batch", "momentum", "adascale", "sqrt")
OPTIMIZERS = ("sgd", "adamw")
# the library code a launch runs; the benchmark refuses to mix versions
FINGERPRINTED = ("strategies", "models", "data", "callbacks")


def library_fingerprint(package: Path) -> str:
    """SHA-256 (first 16 hex digits) of the package sources the benchmark exercises."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(p for folder in FINGERPRINTED for p in (package / folder).rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------------------- worker


def _make_rule(name: str) -> Any:
    from lightning_bandlimit.strategies import (
        AdaScale,
        KeepGlobalBatch,
        LinearScaling,
        MomentumAwareScaling,
        NoScaling,
        SquareRootScaling,
    )

    return {
        "none": NoScaling,
        "linear": LinearScaling,
        "keep-global-batch": KeepGlobalBatch,
        "momentum": MomentumAwareScaling,
        "adascale": AdaScale,
        "sqrt": SquareRootScaling,
    }[name]()


def worker(cfg: dict[str, Any]) -> None:
    """One launch (one phase) of a run; every rank executes this (Lightning re-runs the command)."""
    import lightning.pytorch as pl
    import torch

    from lightning_bandlimit.data import SyntheticImageDataModule
    from lightning_bandlimit.models import ImageClassifier
    from lightning_bandlimit.strategies import ElasticDDPStrategy, SampleSchedule

    class AdamWClassifier(ImageClassifier):
        """``ImageClassifier`` trained by AdamW with the same ``SampleSchedule``."""

        def configure_optimizers(self) -> Any:
            hp = self.hparams
            optimizer = torch.optim.AdamW(
                self.parameters(), lr=hp.learning_rate, weight_decay=hp.weight_decay
            )
            total_steps = max(1, int(self.trainer.estimated_stepping_batches))
            schedule = self._sample_schedule(optimizer, total_steps)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    class PrefilledData(SyntheticImageDataModule):
        """The synthetic data module with its image cache filled from images rendered by the parent."""

        def setup(self, stage: str | None = None) -> None:
            super().setup(stage)
            rendered = torch.load(cfg["data"], weights_only=True)
            for dataset, images in ((self.train_set, rendered["train"]), (self.val_set, rendered["val"])):
                assert len(images) == len(dataset) and dataset._cache is not None
                dataset._cache.update(enumerate(images))

    class PhaseEnd(pl.Callback):
        """Save the checkpoint and stop right after the optimizer step that reaches ``end`` samples."""

        def __init__(self, end: int | None, path: str | None) -> None:
            self.end, self.path, self._step = end, path, 0

        def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
            self._step = trainer.global_step

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            seen = trainer.strategy.samples_seen
            if self.end is None or trainer.global_step == self._step or seen < self.end:
                return
            if seen != self.end:
                raise RuntimeError(f"phase overshot its end: {seen} samples seen, planned {self.end}")
            trainer.save_checkpoint(self.path)  # a collective: every rank calls it
            trainer.should_stop = True

    class RecordIndices(pl.Callback):
        """Which training images (by index) this rank trained on, per epoch."""

        def __init__(self, lookup: dict[bytes, int]) -> None:
            self.lookup, self.seen = lookup, {}

        def on_train_batch_start(
            self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int
        ) -> None:
            keys = batch[0][:, 0, 0, :8].contiguous().numpy()
            indices = [self.lookup[row.tobytes()] for row in keys]
            self.seen.setdefault(str(trainer.current_epoch), []).extend(indices)

    t_start = time.perf_counter()
    import lightning_bandlimit

    package = Path(lightning_bandlimit.__file__).parent
    fingerprint = library_fingerprint(package)
    pl.seed_everything(cfg["seed"], verbose=False)
    data = PrefilledData(
        train_size=cfg["train_size"],
        val_size=cfg["val_size"],
        test_size=0,
        batch_size=cfg["batch"],
        seed=cfg["seed"],
    )
    data.setup("fit")
    train_images = torch.stack([data.train_set[i][0] for i in range(len(data.train_set))])
    lookup = {row.tobytes(): i for i, row in enumerate(train_images[:, 0, 0, :8].contiguous().numpy())}
    if len(lookup) != len(train_images):
        raise RuntimeError("two training images share their first pixels; cannot record indices")
    model_class = AdamWClassifier if cfg["optimizer"] == "adamw" else ImageClassifier
    model = model_class(
        "small_cnn", width=cfg["width"], lr_schedule="samples", learning_rate=cfg["lr"], momentum=0.9
    )
    recorder = RecordIndices(lookup)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=cfg["devices"],
        strategy=ElasticDDPStrategy(rule=_make_rule(cfg["rule"]), cpu_threads=1, seed=cfg["seed"]),
        max_epochs=cfg["epochs"],
        accumulate_grad_batches=cfg["accumulation"],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[PhaseEnd(cfg.get("phase_end"), cfg.get("save")), recorder],
    )
    t_fit = time.perf_counter()
    trainer.fit(model, train_dataloaders=data.train_dataloader(), ckpt_path=cfg.get("resume"))
    fit_s = time.perf_counter() - t_fit
    strategy = trainer.strategy
    out = Path(cfg["out"])
    (out.parent / f"{out.stem}-indices-rank{trainer.global_rank}.json").write_text(json.dumps(recorder.seen))
    record: dict[str, Any] = {}
    if cfg.get("validate"):
        t_val = time.perf_counter()
        (metrics,) = trainer.validate(model, dataloaders=data.val_dataloader(), verbose=False)
        record.update(
            val_acc=float(metrics["val/acc"]),
            val_loss=float(metrics["val/loss"]),
            val_s=time.perf_counter() - t_val,
        )
    if trainer.global_rank == 0:
        schedule = next(
            c.scheduler for c in trainer.lr_scheduler_configs if isinstance(c.scheduler, SampleSchedule)
        )
        applied = strategy.applied
        record.update(
            devices=cfg["devices"],
            accumulation_launched=cfg["accumulation"],
            accumulation_applied=trainer.accumulate_grad_batches,
            rule=cfg["rule"],
            samples_seen=strategy.samples_seen,
            global_step=trainer.global_step,
            epoch=trainer.current_epoch,
            resized_from=strategy.resized_from,
            rollbacks=strategy.rollbacks,
            applied=None if applied is None else {**applied.__dict__, "global_batch": applied.global_batch},
            adascale_gain=strategy.gain if cfg["rule"] == "adascale" else None,
            schedule_progress=schedule.progress,
            schedule_total=schedule.total_samples,
            final_lr=float(trainer.optimizers[0].param_groups[0]["lr"]),
            fit_s=fit_s,
            worker_s=time.perf_counter() - t_start,
            threads=torch.get_num_threads(),
            library=fingerprint,
            library_path=str(package),
        )
        out.write_text(json.dumps(record))


# ---------------------------------------------------------------------------------------- parent


def render_data(seed: int, train_size: int, val_size: int, path: Path) -> None:
    """Render the training and validation images of ``seed`` once, for all launches."""
    import torch

    from lightning_bandlimit.data.synthetic import SyntheticImages

    torch.set_num_threads(1)  # tiny FFTs: more threads only contend on a loaded machine

    def stack(size: int, split: str) -> torch.Tensor:
        data = SyntheticImages(size, seed, split, cache=False)
        return torch.stack([data[i][0] for i in range(size)]) if size else torch.empty(0, 3, 32, 32)

    torch.save({"train": stack(train_size, "train"), "val": stack(val_size, "val")}, path)


def launch(cfg: dict[str, Any], log: Path, library: Path) -> tuple[dict[str, Any], float]:
    """Run one phase in a fresh process on the library snapshot; return rank 0's record and the wall time."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(library), os.environ.get("PYTHONPATH")])),
    }
    env.pop("MASTER_PORT", None)
    start = time.perf_counter()
    with log.open("w") as handle:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(cfg)],
            check=False,
            cwd=log.parent,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=900,
        )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = log.read_text()[-4000:]
        raise RuntimeError(f"launch failed (exit {done.returncode}), log {log}:\n{tail}")
    return json.loads(Path(cfg["out"]).read_text()), wall


def phase_ends(total: int, quantum: int) -> tuple[int, int]:
    """The thirds of the budget, rounded to a multiple of the largest global batch."""
    first = max(quantum, round(total / 3 / quantum) * quantum)
    second = max(first + quantum, round(2 * total / 3 / quantum) * quantum)
    if second >= total:
        raise ValueError(f"budget of {total} samples too small for three phases of multiples of {quantum}")
    return first, second


def check_exactly_once(index_files: list[Path], epochs: int, train_size: int) -> bool:
    per_epoch: dict[str, list[int]] = {}
    for path in index_files:
        for epoch, indices in json.loads(path.read_text()).items():
            per_epoch.setdefault(epoch, []).extend(indices)
    expected = list(range(train_size))
    return sorted(per_epoch) == sorted(str(e) for e in range(epochs)) and all(
        sorted(indices) == expected for indices in per_epoch.values()
    )


class Bench:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args, self.workdir = args, workdir
        self.total = args.epochs * args.train_size
        quantum = args.batch * max(d * a for phases in SCHEDULES.values() for d, a in phases)
        self.ends = phase_ends(self.total, quantum)
        self._first: dict[tuple[str, int], dict[str, Any]] = {}
        # A private copy of the package, taken now: the working tree may change under a long run.
        self.snapshot = workdir / "lib"
        shutil.copytree(
            REPO_ROOT / "lightning_bandlimit",
            self.snapshot / "lightning_bandlimit",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        self.library = library_fingerprint(self.snapshot / "lightning_bandlimit")

    def launch(self, cfg: dict[str, Any], log: Path) -> tuple[dict[str, Any], float]:
        record, wall = launch(cfg, log, self.snapshot)
        if record["library"] != self.library:
            raise RuntimeError(
                f"a launch ran other library sources ({record['library_path']}, fingerprint "
                f"{record['library']}) "
                f"than the snapshot ({self.library})"
            )
        return record, wall

    def base_cfg(
        self, optimizer: str, rule: str, seed: int, devices: int, accumulation: int, out: Path
    ) -> dict[str, Any]:
        a = self.args
        return {
            "optimizer": optimizer,
            "rule": rule,
            "seed": seed,
            "devices": devices,
            "accumulation": accumulation,
            "epochs": a.epochs,
            "train_size": a.train_size,
            "val_size": a.val_size,
            "batch": a.batch,
            "width": a.width,
            "lr": a.lr_sgd if optimizer == "sgd" else a.lr_adamw,
            "data": str(self.workdir / f"data-seed{seed}.pt"),
            "out": str(out),
        }

    def first_phase(self, optimizer: str, seed: int) -> dict[str, Any]:
        """Phase 1 (1 process, rule-independent): run once per optimizer and seed."""
        key = (optimizer, seed)
        if key not in self._first:
            folder = self.workdir / f"{optimizer}-seed{seed}-phase1"
            folder.mkdir()
            cfg = self.base_cfg(optimizer, "none", seed, 1, 1, folder / "phase1.json")
            cfg.update(phase_end=self.ends[0], save=str(folder / "phase1.ckpt"))
            record, wall = self.launch(cfg, folder / "phase1.log")
            self._first[key] = {
                "record": {**record, "wall_s": wall},
                "ckpt": cfg["save"],
                "indices": sorted(folder.glob("phase1-indices-rank*.json")),
            }
        return self._first[key]

    def run(self, optimizer: str, schedule: str, rule: str, seed: int) -> dict[str, Any]:
        folder = self.workdir / f"{optimizer}-{schedule}-{rule}-seed{seed}"
        folder.mkdir()
        phases: list[dict[str, Any]] = []
        index_files: list[Path] = []
        if schedule == "fixed":
            cfg = self.base_cfg(optimizer, rule, seed, 1, 1, folder / "phase1.json")
            cfg["validate"] = True
            record, wall = self.launch(cfg, folder / "phase1.log")
            phases.append({**record, "wall_s": wall})
        else:
            first = self.first_phase(optimizer, seed)
            phases.append({**first["record"], "shared": True})
            index_files += first["indices"]
            resume = first["ckpt"]
            for number, (devices, accumulation) in enumerate(SCHEDULES[schedule][1:], start=2):
                cfg = self.base_cfg(
                    optimizer, rule, seed, devices, accumulation, folder / f"phase{number}.json"
                )
                cfg["resume"] = resume
                if number < len(SCHEDULES[schedule]):
                    cfg.update(phase_end=self.ends[number - 1], save=str(folder / f"phase{number}.ckpt"))
                    resume = cfg["save"]
                else:
                    cfg["validate"] = True
                record, wall = self.launch(cfg, folder / f"phase{number}.log")
                phases.append({**record, "wall_s": wall})
        index_files += sorted(folder.glob("phase*-indices-rank*.json"))
        final = phases[-1]
        if final["samples_seen"] != self.total:
            raise RuntimeError(f"{folder.name}: {final['samples_seen']} samples seen, planned {self.total}")
        exactly_once = check_exactly_once(index_files, self.args.epochs, self.args.train_size)
        if not exactly_once:
            raise RuntimeError(
                f"{folder.name}: the phases did not see each training sample exactly once per epoch"
            )
        return {
            "optimizer": optimizer,
            "schedule": schedule,
            "rule": rule,
            "seed": seed,
            "val_acc": final["val_acc"],
            "val_loss": final["val_loss"],
            "samples_seen": final["samples_seen"],
            "exactly_once": exactly_once,
            "wall_s": sum(p["wall_s"] for p in phases),
            "fit_s": sum(p["fit_s"] for p in phases),
            "rollbacks": sum(len(p["rollbacks"]) for p in phases),
            "phases": phases,
        }


def plan(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    runs: list[tuple[str, str, str]] = []
    for optimizer in args.optimizers:
        allowed = SGD_RULES if optimizer == "sgd" else ADAM_RULES
        rules = [r for r in args.rules if r in allowed]
        if not rules:
            continue
        runs.append((optimizer, "fixed", "none"))
        if "1-1-1" in args.schedules:  # the restart control: no resize, so no rule applies
            runs.append((optimizer, "1-1-1", "none"))
        runs += [(optimizer, s, r) for s in args.schedules if s != "1-1-1" for r in rules]
    return runs


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def mean_std(values: list[float]) -> tuple[float, float]:
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0

    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["optimizer"], r["schedule"], r["rule"]), []).append(r)
    rows = []
    for (optimizer, schedule, rule), runs in groups.items():
        fixed = {r["seed"]: r for r in groups.get((optimizer, "fixed", "none"), [])}
        acc = [100 * r["val_acc"] for r in runs]
        paired = [100 * (r["val_acc"] - fixed[r["seed"]]["val_acc"]) for r in runs if r["seed"] in fixed]
        acc_mean, acc_std = mean_std(acc)
        fixed_mean = statistics.fmean(100 * r["val_acc"] for r in fixed.values()) if fixed else math.nan
        diff = acc_mean - fixed_mean
        rows.append(
            {
                "optimizer": optimizer,
                "schedule": schedule,
                "rule": rule,
                "seeds": sorted(r["seed"] for r in runs),
                "acc_mean": acc_mean,
                "acc_std": acc_std,
                "diff_points": diff,
                "paired_diff_mean": mean_std(paired)[0] if paired else math.nan,
                "paired_diff_std": mean_std(paired)[1] if paired else math.nan,
                "within_target": None if schedule == "fixed" else bool(abs(diff) <= TARGET_POINTS),
                "wall_s_mean": statistics.fmean(r["wall_s"] for r in runs),
                "fit_s_mean": statistics.fmean(r["fit_s"] for r in runs),
                "rollbacks": sum(r["rollbacks"] for r in runs),
            }
        )
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'opt':<6} {'schedule':<7} {'rule':<17} {'val acc % (mean +- std)':>23} {'diff pts':>8} "
        f"{'paired diff':>14} {'<=0.5':>5} {'wall s':>7} {'fit s':>6} {'rollb':>5}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        within = "-" if r["within_target"] is None else ("yes" if r["within_target"] else "NO")
        diff = "-" if r["schedule"] == "fixed" else f"{r['diff_points']:+.2f}"
        paired = (
            "-" if r["schedule"] == "fixed" else f"{r['paired_diff_mean']:+.2f} +- {r['paired_diff_std']:.2f}"
        )
        lines.append(
            f"{r['optimizer']:<6} {r['schedule']:<7} {r['rule']:<17} {r['acc_mean']:>14.2f} +- "
            f"{r['acc_std']:<5.2f} "
            f"{diff:>8} {paired:>14} {within:>5} {r['wall_s_mean']:>7.1f} {r['fit_s_mean']:>6.1f} "
            f"{r['rollbacks']:>5}"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Top: val accuracy (mean +- std over seeds) with the fixed run's mean and a +-0.5-point band.
    Bottom: the paired difference to the fixed run of the same seed (mean +- std), target band 0 +- 0.5."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    optimizers = [o for o in OPTIMIZERS if any(r["optimizer"] == o for r in rows)]
    fig = Figure(figsize=(5.5 * len(optimizers), 7.6))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(optimizers), squeeze=False)
    markers = {
        "1-1-1": ("^", "tab:gray", "restarted 1-1-1 (control)"),
        "1-2-1": ("o", "tab:blue", "resized 1-2-1"),
        "1-4x-1": ("s", "tab:orange", "resized 1-4x-1"),
    }
    for column, optimizer in enumerate(optimizers):
        top, bottom = axes[0][column], axes[1][column]
        mine = [r for r in rows if r["optimizer"] == optimizer]
        rules = [r for r in ALL_RULES if any(x["rule"] == r and x["schedule"] != "fixed" for x in mine)]
        fixed = next((r for r in mine if r["schedule"] == "fixed"), None)
        if fixed is not None:
            top.axhline(fixed["acc_mean"], color="k", lw=1, label="fixed run (1 process), mean over seeds")
            top.axhspan(
                fixed["acc_mean"] - TARGET_POINTS,
                fixed["acc_mean"] + TARGET_POINTS,
                color="0.85",
                label="target: within 0.5 points of it",
            )
        bottom.axhline(0.0, color="k", lw=1)
        bottom.axhspan(-TARGET_POINTS, TARGET_POINTS, color="0.85")
        schedules = [s for s in markers if any(r["schedule"] == s for r in mine)]
        for k, schedule in enumerate(schedules):
            marker, colour, label = markers[schedule]
            offset = (k - (len(schedules) - 1) / 2) * 0.18
            points = [
                (i + offset, r)
                for i, rule in enumerate(rules)
                for r in mine
                if (r["rule"], r["schedule"]) == (rule, schedule)
            ]
            xs = [x for x, _ in points]
            top.errorbar(
                xs,
                [r["acc_mean"] for _, r in points],
                yerr=[r["acc_std"] for _, r in points],
                fmt=marker,
                color=colour,
                capsize=3,
                label=label,
            )
            bottom.errorbar(
                xs,
                [r["paired_diff_mean"] for _, r in points],
                yerr=[r["paired_diff_std"] for _, r in points],
                fmt=marker,
                color=colour,
                capsize=3,
                label=label,
            )
        for ax in (top, bottom):
            ax.set_xticks(range(len(rules)), rules, rotation=20)
            ax.grid(axis="y", alpha=0.3)
        where = "" if fixed is None else f"; fixed {fixed['acc_mean']:.2f} +- {fixed['acc_std']:.2f}"
        top.set_title(f"{optimizer}: val accuracy, mean +- std over seeds{where}", fontsize=9)
        top.set_ylabel("val/acc (%)")
        bottom.set_title(f"{optimizer}: minus the fixed run of the same seed (mean +- std)", fontsize=9)
        bottom.set_ylabel("difference (points)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)


def versions() -> dict[str, Any]:
    import lightning
    import torch

    def git(*cmd: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *cmd], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    cpu = platform.processor() or platform.machine()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    status = git("status", "--porcelain")
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "timestamp": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: seed 0, 1-4x-1 with linear and sqrt, tiny budget"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 2 (0 with --quick)")
    parser.add_argument(
        "--rules",
        nargs="+",
        choices=ALL_RULES,
        default=None,
        help="rules of the resized runs (default: all; 'none' is run for every optimizer)",
    )
    parser.add_argument("--optimizers", nargs="+", choices=OPTIMIZERS, default=list(OPTIMIZERS))
    parser.add_argument(
        "--schedules",
        nargs="+",
        choices=["1-1-1", "1-2-1", "1-4x-1"],
        default=None,
        help="resized schedules (1-1-1: two restarts without a resize, a control; default: all; "
        "1-4x-1 with --quick)",
    )
    parser.add_argument(
        "--train-size", type=int, default=None, help="training images (default 4096; 512 with --quick)"
    )
    parser.add_argument(
        "--val-size", type=int, default=None, help="validation images (default 2000; 500 with --quick)"
    )
    parser.add_argument(
        "--epochs", type=int, default=None, help="epochs of budget (default 5; 2 with --quick)"
    )
    parser.add_argument("--batch", type=int, default=64, help="per-device batch")
    parser.add_argument("--width", type=int, default=8, help="small_cnn width")
    parser.add_argument("--lr-sgd", type=float, default=0.1, help="base LR of SGD (all rules)")
    parser.add_argument("--lr-adamw", type=float, default=1e-2, help="base LR of AdamW (all rules)")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help=f"JSON path (default {DEFAULT_OUTPUT.relative_to(REPO_ROOT)}, elastic-quick.json with "
        "--quick); "
        "the plot is written next to it with .png",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep the library copy, checkpoints and logs here (a new or empty directory; "
        "default: a temporary one, removed)",
    )
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {
        "seeds": [0] if quick else [0, 1, 2],
        "rules": ["linear", "sqrt"] if quick else list(ALL_RULES),
        "schedules": ["1-4x-1"] if quick else ["1-1-1", "1-2-1", "1-4x-1"],
        "train_size": 512 if quick else 4096,
        "val_size": 500 if quick else 2000,
        "epochs": 2 if quick else 5,
        "output": DEFAULT_OUTPUT.with_name("elastic-quick.json") if quick else DEFAULT_OUTPUT,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker is not None:
        worker(json.loads(args.worker))
        return
    started = time.perf_counter()
    info = versions()  # at the start: the commit the library snapshot is taken from
    runs = plan(args)
    if not runs:
        raise SystemExit("nothing to run: no rule applies to the chosen optimizers")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="elastic-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    bench = Bench(args, workdir)
    sys.path.insert(0, str(bench.snapshot))  # the parent renders the data with the snapshot too
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--", *(f"lightning_bandlimit/{d}" for d in FINGERPRINTED)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    library_changed = None if changed.returncode else bool(changed.stdout.strip())
    print(
        f"budget {bench.total} samples ({args.epochs} x {args.train_size}), phase ends {bench.ends}; "
        f"{len(runs)} configurations x {len(args.seeds)} seeds; work dir {workdir}",
        flush=True,
    )
    results: list[dict[str, Any]] = []
    try:
        for seed in args.seeds:
            t = time.perf_counter()
            render_data(seed, args.train_size, args.val_size, workdir / f"data-seed{seed}.pt")
            print(f"seed {seed}: rendered data in {time.perf_counter() - t:.1f} s", flush=True)
            for optimizer, schedule, rule in runs:
                result = bench.run(optimizer, schedule, rule, seed)
                results.append(result)
                print(
                    f"  {optimizer:<6} {schedule:<7} {rule:<17} seed {seed}: val acc "
                    f"{100 * result['val_acc']:6.2f} %  "
                    f"wall {result['wall_s']:6.1f} s  rollbacks {result['rollbacks']}  "
                    f"[{time.perf_counter() - started:6.0f} s elapsed]",
                    flush=True,
                )
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    rows = summarize(results)
    table = format_table(rows)
    elapsed = time.perf_counter() - started
    print()
    print(table)
    misses = [f"{r['optimizer']} {r['schedule']} {r['rule']}" for r in rows if r["within_target"] is False]
    print(
        f"\ntarget |diff| <= {TARGET_POINTS} points of the fixed run: "
        + ("all resized runs meet it" if not misses else f"missed by {', '.join(misses)}")
    )
    print(f"total wall time {elapsed:.0f} s")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "worker"}
        | {
            "total_samples": bench.total,
            "phase_ends": list(bench.ends),
            "schedules": SCHEDULES,
            "target_points": TARGET_POINTS,
            "cpu_threads_per_process": 1,
            "library_fingerprint": bench.library,
            "library_uncommitted_changes": library_changed,
        },
        "versions": info,
        "elapsed_s": elapsed,
        "table": rows,
        "table_text": table,
        "results": results,
    }
    args.output.write_text(json.dumps(report, indent=2))
    plot(rows, args.output.with_suffix(".png"))
    print(f"wrote {args.output} and {args.output.with_suffix('.png')}")


if __name__ == "__main__":
    main()
