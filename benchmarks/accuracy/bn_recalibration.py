"""BatchNorm that follows the compression: eval accuracy after a switch, with and without re-estimation.

Target (issue "BatchNorm that follows the compression"): eval-mode accuracy after a compression
change within 1 point of the fully re-estimated model. ``ImageClassifier`` (default
``cifar_resnet18``, width 8) on ``SyntheticImageDataModule``; a seed fixes init, data and order.

* **switch** (the ``Trainer`` path): ``AdaptiveBandLimit`` driven by a ``ScriptedProbe``: memory
  runs out early (compression 0 -> 0.75 in one raise) and comes back in the last epoch; the
  controller releases 0.75 -> 0 in steps of ``--lower-step``, the last ``--settle`` steps before
  the end (checked against ``decisions``). One fit per ``recalibrate_bn`` in ``--variants`` (0: the
  running averages as training left them). Train-mode BatchNorm uses batch statistics and the
  re-estimate restores the random state, so the fits end with identical weights (checked). Per
  fit: the Trainer's last ``val/acc`` (our own eval pass must agree), the same model after a
  *full* re-estimate (``recalibrate_batchnorm`` over the whole training loader), and the gap full -
  Trainer; verdicts ``|gap| <= 1`` (the target) and ``gap <= 1`` (at most 1 point worse). Noise
  floor: the accuracy after re-estimates over disjoint windows of 8 training batches.
* **cost**: the callback's ``bn_recalibration_seconds`` (``bn_recalibrations`` runs) against the
  fit's wall time, and one re-estimate in training steps.
* **drift**: fixed compression, ``BandLimit(0.5, recalibrate_bn=0)`` and the plain model, one fit
  each: the running averages (Trainer ``val/acc``), a re-estimate over the last 8 training batches
  (what ``recalibrate_bn=8`` does before that validation: same weights, same batches), and full.

    .venv/bin/python -m benchmarks.accuracy.bn_recalibration  # about 8 minutes on 2 cores
    # a smoke run:
    .venv/bin/python -m benchmarks.accuracy.bn_recalibration --seeds 0 --parts switch --epochs 2
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import math
import os
import statistics
import sys
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning
import lightning.pytorch as pl
import torch

from benchmarks.common.provenance import RESULTS, command, git_commit, git_dirty
from benchmarks.common.trainer import QUIET
from lightning_bandlimit.callbacks import AdaptiveBandLimit, BandLimit
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.layers.batchnorm import RecentBatches, recalibrate_batchnorm
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.models import ImageClassifier

HIGH_C, TOTAL, MIN_FREE, RELEASE_FREE = 0.75, 2**50, 0.2, 0.5
RELEASE_CHECKS, COOLDOWN_CHECKS = 3, 2  # the controller's defaults, passed explicitly


class LastBatches(pl.Callback):
    """Keeps the last ``n`` training batches (what ``recalibrate_bn=n`` would use)."""

    def __init__(self, n: int) -> None:
        self.recent = RecentBatches(n)

    def on_train_batch_end(
        self, trainer: pl.Trainer, module: pl.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        self.recent.append(batch)


def evaluate(model: torch.nn.Module, loader: Any) -> float:
    """Eval-mode top-1 accuracy in %."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += int((model(images).argmax(-1) == labels).sum())
            total += len(labels)
    return 100.0 * correct / total


def fingerprint(model: torch.nn.Module) -> str:
    """Hash of the trainable weights (BatchNorm buffers excluded)."""
    return hashlib.sha256(
        b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())
    ).hexdigest()[:16]


def release_probe(total_steps: int, args: argparse.Namespace) -> ScriptedProbe:
    """Free memory per check (one check per step; read ``i`` happens at step ``i + 1``)."""
    drops = math.ceil(HIGH_C / args.lower_step - 1e-9)
    last_read = total_steps - args.settle - 1
    first_high = last_read - (RELEASE_CHECKS - 1) - max(RELEASE_CHECKS, COOLDOWN_CHECKS + 1) * (drops - 1)
    raise_read = total_steps // 10
    hold = int(0.35 * TOTAL)  # between min_free and release_free: no change
    return ScriptedProbe(lambda i: 0 if i == raise_read else TOTAL if i >= first_high else hold, total=TOTAL)


def fit(
    seed: int, callbacks: list[pl.Callback], args: argparse.Namespace
) -> tuple[ImageClassifier, SyntheticImageDataModule, dict[str, Any]]:
    pl.seed_everything(seed, verbose=False)
    data = SyntheticImageDataModule(
        train_size=args.train_size, val_size=args.val_size, batch_size=args.batch, seed=seed
    )
    model = ImageClassifier(args.backbone, width=args.width, learning_rate=args.lr)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=args.epochs,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        **QUIET,
    )
    started = time.perf_counter()
    trainer.fit(model, data)
    fit_s = time.perf_counter() - started
    row = dict(
        seed=seed,
        fit_s=fit_s,
        steps=trainer.global_step,
        trainer_acc=round(100.0 * float(trainer.callback_metrics["val/acc"]), 2),
    )
    row["eval_acc"] = evaluate(model, data.val_dataloader())  # must equal trainer_acc: same model, same data
    return model, data, row


def reestimated(model: ImageClassifier, data: SyntheticImageDataModule, batches: Iterable[Any]) -> float:
    """Eval accuracy after re-estimating the BatchNorm statistics over ``batches``."""
    recalibrate_batchnorm(model, batches)
    return evaluate(model, data.val_dataloader())


def switch_run(seed: int, recal: int, args: argparse.Namespace) -> dict[str, Any]:
    steps = args.epochs * math.ceil(args.train_size / args.batch)
    callback = AdaptiveBandLimit(
        probe=release_probe(steps, args),
        min_free=MIN_FREE,
        release_free=RELEASE_FREE,
        check_every_n_steps=1,
        max_compression=HIGH_C,
        raise_step=HIGH_C,
        lower_step=args.lower_step,
        release_checks=RELEASE_CHECKS,
        cooldown_checks=COOLDOWN_CHECKS,
        recalibrate_bn=recal,
    )
    model, data, row = fit(seed, [callback], args)
    changes = [(d["step"], d["compression"]) for d in callback.decisions if d["reason"] != "hold"]
    row.update(
        variant=f"recalibrate_bn={recal}",
        recalibrate_bn=recal,
        final_compression=callback.compression,
        changes=changes,
        steps_at_final=row["steps"] - changes[-1][0] if changes else None,
        bn_recalibrations=callback.bn_recalibrations,
        bn_recalibration_s=callback.bn_recalibration_seconds,
        bn_cost_pct=100.0 * callback.bn_recalibration_seconds / row["fit_s"],
        weights=fingerprint(model),
    )
    if callback.compression != 0.0 or row["steps_at_final"] != args.settle:
        print(
            f"  WARNING seed {seed}: schedule missed: changes {changes}, final {callback.compression}",
            file=sys.stderr,
        )
    row["recal_cost_steps"] = (
        callback.bn_recalibration_seconds / max(1, callback.bn_recalibrations) / (row["fit_s"] / row["steps"])
    )
    row["full_acc"] = reestimated(
        model, data, data.train_dataloader()
    )  # same RNG state, same order for every variant
    if recal and recal == max(args.variants):  # noise floor; the weights are the same for every variant
        batches = list(data.train_dataloader())
        row["window_accs"] = [
            reestimated(model, data, batches[i : i + recal])
            for i in range(0, len(batches) - recal + 1, recal)
        ]
    row["gap"] = row["full_acc"] - row["trainer_acc"]
    return row


def drift_run(seed: int, setting: str, args: argparse.Namespace) -> dict[str, Any]:
    last = LastBatches(8)
    callbacks: list[pl.Callback] = [last] if setting == "plain" else [BandLimit(0.5, recalibrate_bn=0), last]
    model, data, row = fit(seed, callbacks, args)
    row.update(variant=setting, last8_acc=reestimated(model, data, list(last.recent.on(torch.device("cpu")))))
    row["full_acc"] = reestimated(model, data, data.train_dataloader())
    row.update(gap_stale=row["full_acc"] - row["trainer_acc"], gap_last8=row["full_acc"] - row["last8_acc"])
    return row


def sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def pm(values: list[float]) -> str:
    return f"{statistics.mean(values):+.2f} +- {sd(values):.2f}"


def switch_table(rows: list[dict[str, Any]], args: argparse.Namespace, summary: dict[str, Any]) -> list[str]:
    lines = [
        f"\n## Switch: c 0 -> {HIGH_C} at step {rows[0]['changes'][0][0]}, released to "
        f"{rows[0]['final_compression']:g} "
        f"{args.settle} steps before the end ({rows[0]['steps']} steps); gap = full re-estimate - Trainer "
        "val/acc",
        "| recalibrate_bn | seed | val/acc (Trainer) | full re-estimate | gap (pts) | same weights | BN "
        "recal s (n) / fit s (%) | 1 recal in steps |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for recal in args.variants:
        group = [r for r in rows if r["recalibrate_bn"] == recal]
        for r in group:
            same = r["weights"] == next(s["weights"] for s in rows if s["seed"] == r["seed"])
            lines.append(
                f"| {recal} | {r['seed']} | {r['trainer_acc']:.2f} | {r['full_acc']:.2f} | {r['gap']:+.2f} | "
                f"{'yes' if same else 'NO'} "
                f"| {r['bn_recalibration_s']:.2f} ({r['bn_recalibrations']}) / {r['fit_s']:.1f} "
                f"({r['bn_cost_pct']:.1f} %) | {r['recal_cost_steps']:.2f} |"
            )
        ok, cost = all(abs(r["gap"]) <= 1.0 for r in group), statistics.mean(r["bn_cost_pct"] for r in group)
        not_worse = all(
            r["gap"] <= 1.0 for r in group
        )  # the callback's model at most 1 point below the full re-estimate
        summary[f"switch recalibrate_bn={recal}"] = {
            "gaps": [r["gap"] for r in group],
            "gap_mean": statistics.mean(r["gap"] for r in group),
            "within_1pt": ok,
            "at_most_1pt_worse": not_worse,
            "bn_cost_pct_mean": cost,
        }
        lines.append(
            f"| **{recal}** | mean | | | **{pm([r['gap'] for r in group])}** | | {cost:.1f} % | "
            f"\\|gap\\|<=1: {'PASS' if ok else 'MISS'}; gap<=1: {'PASS' if not_worse else 'MISS'} |"
        )
    lines += [
        f"Noise floor, seed {r['seed']}: acc after re-estimates over disjoint {r['recalibrate_bn']}-batch "
        "windows: "
        f"{' '.join(f'{a:.1f}' for a in r['window_accs'])} (std {sd(r['window_accs']):.2f}; full "
        f"{r['full_acc']:.1f})"
        for r in rows
        if "window_accs" in r
    ]
    mismatch = [r for r in rows if abs(r["trainer_acc"] - r["eval_acc"]) > 0.05]
    lines.append(
        f"Trainer val/acc vs own eval pass: {'agree' if not mismatch else f'{len(mismatch)} DISAGREE'}"
    )
    return lines


def drift_table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    lines = [
        "\n## Drift at a fixed compression (gap = full re-estimate - that estimate)",
        "| setting | seed | running avg (Trainer) | last 8 batches | full | gap running | gap last 8 |",
        "|---|---|---|---|---|---|---|",
    ]
    for setting in ("plain", "c=0.5"):
        group = [r for r in rows if r["variant"] == setting]
        lines += [
            f"| {setting} | {r['seed']} | {r['trainer_acc']:.2f} | {r['last8_acc']:.2f} | "
            f"{r['full_acc']:.2f} | "
            f"{r['gap_stale']:+.2f} | {r['gap_last8']:+.2f} |"
            for r in group
        ]
        stale, last8 = [r["gap_stale"] for r in group], [r["gap_last8"] for r in group]
        lines.append(f"| **{setting}** | mean | | | | **{pm(stale)}** | **{pm(last8)}** |")
        summary[f"drift {setting}"] = {"gaps_stale": stale, "gaps_last8": last8}
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", nargs="+", default=["switch", "drift"], choices=["switch", "drift"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", type=int, default=[0, 4, 8], help="recalibrate_bn values")
    parser.add_argument("--backbone", default="cifar_resnet18", choices=["cifar_resnet18", "small_cnn"])
    for name, default in {
        "--width": 8,
        "--epochs": 4,
        "--train-size": 2048,
        "--val-size": 1000,
        "--batch": 64,
    }.items():
        parser.add_argument(name, type=int, default=default)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--lower-step", type=float, default=0.25, help="release step of the controller")
    parser.add_argument("--settle", type=int, default=2, help="training steps after the last release")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--output", type=Path, default=RESULTS / "bn_recalibration.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*(num_workers|isinstance\(treespec).*")
    started = time.perf_counter()

    lines: list[str] = []
    switch: list[dict[str, Any]] = []
    drift: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    if "switch" in args.parts:
        for seed in args.seeds:
            for recal in args.variants:
                print(f"  switch seed {seed} recalibrate_bn={recal}", file=sys.stderr, flush=True)
                switch.append(row := switch_run(seed, recal, args))
                print(
                    f"    changes (step, c): {row['changes']}; acc {row['trainer_acc']:.1f}, full "
                    f"{row['full_acc']:.1f}",
                    file=sys.stderr,
                )
        lines += switch_table(switch, args, summary)
    if "drift" in args.parts:
        for seed in args.seeds:
            for setting in ("plain", "c=0.5"):
                print(f"  drift seed {seed} {setting}", file=sys.stderr, flush=True)
                drift.append(drift_run(seed, setting, args))
        lines += drift_table(drift, summary)
    total_s = time.perf_counter() - started
    print("\n".join(lines))
    print(f"\ntotal {total_s:.0f} s")

    meta = dict(
        torch=torch.__version__,
        lightning=lightning.__version__,
        threads=args.threads,
        git_commit=git_commit(),
        git_dirty=git_dirty(),
        timestamp=datetime.datetime.now().isoformat(timespec="seconds"),
    )
    rerun = command("benchmarks.accuracy.bn_recalibration", argv or sys.argv[1:])
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            dict(
                benchmark="bn_recalibration",
                command=rerun,
                config=config,
                switch=switch,
                drift=drift,
                summary=summary,
                total_s=total_s,
                meta=meta,
            ),
            indent=2,
        )
    )
    print(f"results: {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
