"""A training job beside a real co-tenant on a shared memory budget: plain vs AdaptiveBandLimit.

Every job is the ``quickstart`` recipe (CIFAR ResNet-18 width 8, synthetic data, CPU) trained in
its own process beside a co-tenant process whose resident memory follows a ramp: low, up a
quarter into the run, held, gone at 70 % (:mod:`lightning_bandlimit.multitenant`). Both
processes' memory is measured in ``/proc`` every step, never modelled; the job processes run
with ``MALLOC_MMAP_THRESHOLD_=131072`` so that freed tensors leave the resident set (the plain
job too: like for like).

Per seed:

* **plain**: the recipe with plain ``nn.Conv2d`` (what the user would otherwise run). It does
  not react to memory, so its accuracy is also plain-without-pressure; the budget is then
  chosen from its measurement so that it does NOT fit beside the co-tenant's peak
  (``budget_for``: ``--below`` of its step memory short), and its over-budget steps are counted
  against that budget (on a GPU each would be an out-of-memory error).
* **adaptive**: ``AdaptiveBandLimit`` from compression ``--floor`` (default 0, the callback's
  default) on that budget, checking every step.
* **fixed c**: ``BandLimit(c)`` for each ``--fixed`` compression, the whole run.

Prints mean +- std over the seeds and the verdicts (0 over-budget steps with the callback;
final accuracy within 2 points of plain), writes ``benchmarks/results/<name>.json`` and
``<name>.png`` (the first seed's timelines; ``--name``, default ``multitenant``).

Run: ``PYTHONPATH=. python benchmarks/multitenant.py`` (about 17 minutes on 2 CPU cores with
the defaults, the main job's training: 3 seeds x 3 jobs x 3 epochs of 8192 images in batches of
256, BatchNorm re-estimated over 2 batches before each validation).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import lightning
import torch

from lightning_bandlimit.memory import RampTrace
from lightning_bandlimit.multitenant import (
    HOST_ALLOCATOR_ENV,
    JobResult,
    JobSpec,
    adaptive_thresholds,
    budget_for,
    launch,
    over_budget,
    plot_timelines,
)

MIB = 2**20


def _mean_std(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}" if values else "-"
    return f"{statistics.mean(values):.3f} +- {statistics.stdev(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-size", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--recalibrate-bn", type=int, default=2, help="BatchNorm re-estimate batches")
    parser.add_argument("--floor", type=float, default=0.0, help="the adaptive job's least compression")
    parser.add_argument("--fixed", type=float, nargs="*", default=[0.75], help="fixed-compression jobs")
    parser.add_argument("--low-mib", type=float, default=32.0, help="co-tenant before and after its peak")
    parser.add_argument("--high-mib", type=float, default=192.0, help="co-tenant at its peak")
    parser.add_argument("--below", type=float, default=0.2, help="budget shortfall, in plain step memory")
    parser.add_argument("--work", type=Path, default=Path("runs/benchmark-multitenant"))
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--name", default="multitenant", help="file stem of the JSON and PNG written")
    args = parser.parse_args()

    ramp = RampTrace(low=int(args.low_mib * MIB), high=int(args.high_mib * MIB))
    trace = asdict(ramp)
    overrides = [
        "--trainer.max_epochs",
        str(args.epochs),
        "--data.train_size",
        str(args.train_size),
        "--data.batch_size",
        str(args.batch_size),
    ]
    started = time.perf_counter()
    rows: list[dict] = []
    first: list[JobResult] = []
    first_budget = 0
    for seed in args.seeds:
        seeded = [*overrides, "--seed_everything", str(seed)]  # same data, another training seed
        work = args.work / f"seed{seed}"
        plain = launch(JobSpec("plain", "plain", str(work / "plain"), trace, overrides=seeded))
        budget = budget_for(plain, ramp, below=args.below)
        min_free, release_free = adaptive_thresholds(plain)
        jobs = [("plain", plain)]
        adaptive = launch(
            JobSpec(
                f"adaptive (floor {args.floor:g})",
                "adaptive",
                str(work / "adaptive"),
                trace,
                overrides=seeded,
                compression=args.floor,
                max_compression=0.9,
                budget=budget,
                min_free=min_free,
                release_free=release_free,
                recalibrate_bn=args.recalibrate_bn,
            )
        )
        jobs.append((adaptive.name, adaptive))
        for c in args.fixed:
            fixed = launch(
                JobSpec(
                    f"fixed {c:g}",
                    "fixed",
                    str(work / f"fixed{c:g}"),
                    trace,
                    overrides=seeded,
                    compression=c,
                    recalibrate_bn=args.recalibrate_bn,
                )
            )
            jobs.append((fixed.name, fixed))
        for name, result in jobs:
            row = {k: v for k, v in asdict(result).items() if k != "timeline"}
            row.update(
                seed=seed,
                setting=name,
                budget_bytes=budget,
                over_budget_steps=over_budget(result, budget),
                steps=len(result.timeline),
                compressions=sorted({r["compression"] for r in result.timeline}),
            )
            rows.append(row)
            print(
                f"seed {seed} {name:<22} acc {result.val_accuracy:.3f}  over budget "
                f"{row['over_budget_steps']:>3}/{row['steps']}"
                f"  peak {result.peak_job_bytes / MIB:.0f} MiB  step {result.step_ms:.0f} ms  c "
                f"{result.final_compression:.2f}",
                flush=True,
            )
        if not first:
            first, first_budget = [r for _, r in jobs], budget

    settings = list(dict.fromkeys(r["setting"] for r in rows))
    plain_acc = {r["seed"]: r["val_accuracy"] for r in rows if r["setting"] == "plain"}
    summary = []
    print(
        f"\n{'setting':<22} {'val acc (mean +- std)':>22} {'acc - plain':>16} {'over-budget steps':>17} "
        f"{'peak MiB':>9} {'step ms':>8}"
    )
    for name in settings:
        group = [r for r in rows if r["setting"] == name]
        diffs = [r["val_accuracy"] - plain_acc[r["seed"]] for r in group]
        entry = {
            "setting": name,
            "seeds": [r["seed"] for r in group],
            "val_accuracy": [r["val_accuracy"] for r in group],
            "accuracy_minus_plain": diffs,
            "over_budget_steps": [r["over_budget_steps"] for r in group],
            "peak_mib": [r["peak_job_bytes"] / MIB for r in group],
            "step_ms": [r["step_ms"] for r in group],
        }
        summary.append(entry)
        print(
            f"{name:<22} {_mean_std(entry['val_accuracy']):>22} {_mean_std(diffs):>16} "
            f"{'/'.join(map(str, entry['over_budget_steps'])):>17} "
            f"{statistics.mean(entry['peak_mib']):>9.0f} "
            f"{statistics.mean(entry['step_ms']):>8.0f}"
        )
    adaptive_entry = next(e for e in summary if e["setting"].startswith("adaptive"))
    verdicts = {
        "adaptive_zero_over_budget": all(n == 0 for n in adaptive_entry["over_budget_steps"]),
        "adaptive_within_2_points_of_plain": statistics.mean(adaptive_entry["accuracy_minus_plain"]) >= -0.02,
        "plain_over_budget_every_seed": all(
            r["over_budget_steps"] > 0 for r in rows if r["setting"] == "plain"
        ),
    }
    for key, ok in verdicts.items():
        print(f"{key}: {'PASS' if ok else 'FAIL'}")
    args.output.mkdir(parents=True, exist_ok=True)
    report = {
        "command": "PYTHONPATH=. python benchmarks/multitenant.py "
        + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
            if k not in ("work", "output", "name")
        ),
        "trace": trace,
        "overrides": overrides,
        "host_allocator_env": HOST_ALLOCATOR_ENV,
        "rows": rows,
        "summary": summary,
        "verdicts": verdicts,
        "wall_s": time.perf_counter() - started,
        "versions": {
            "torch": torch.__version__,
            "lightning": lightning.__version__,
            "python": platform.python_version(),
        },
        "threads": torch.get_num_threads(),
    }
    json_path, png_path = args.output / f"{args.name}.json", args.output / f"{args.name}.png"
    json_path.write_text(json.dumps(report, indent=2))
    plot_timelines(
        first, first_budget, png_path, title=f"seed {args.seeds[0]}: quickstart beside a co-tenant"
    )
    print(f"wrote {json_path} and {png_path} ({report['wall_s'] / 60:.1f} min)")


if __name__ == "__main__":
    main()
