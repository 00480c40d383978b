"""Several training jobs on one device: memory-aware jobs that share it, against what users run.

Every job is the ``quickstart`` recipe (CIFAR ResNet-18 width 8, synthetic data, CPU), each with
its own training seed, in its own process; the jobs of a set start ``--stagger`` seconds apart
and share one budget, smaller than the sum of their plain peaks: ``--below`` (0.4) of one job's
step memory short, which the exact rungs of the set cover (a job's top rung frees about 57 of its
149 MiB; each job also runs beside its co-tenant process and the coordination's ledger). Each job
takes its share of the host's cores (``torch.set_num_threads(cores // jobs)``), not all of them.
Each job measures its own resident memory and the others' in ``/proc`` every step (the CPU
stand-in for a GPU's device-wide free memory), never modelled; the processes run
with ``MALLOC_MMAP_THRESHOLD_=131072`` so that freed tensors leave the resident set. As on a GPU,
each job counts another at the larger of its resident set and its last step's peak (what a
caching allocator keeps reserved between steps, and NVML's per-process memory reports), and every
job loads its whole dataset before its first step (a GPU job's dataset is host memory, not device
memory; the synthetic recipe's cache would otherwise grow the resident set through epoch 0).

Per seed, first each job's **solo** run (plain, alone, with the threads it has in a set: its
accuracy and peak; at 3 epochs a job's accuracy moves by up to 15 points between 1 and 2 threads),
then for 2 and 3 jobs (``--jobs``) the rows (``--rows``):

* **plain**: every job with plain ``nn.Conv2d``, no callback (what users run today).
* **independent**: every job with today's ``AdaptiveBandLimit`` (both levers, from compression
  0), each reacting on its own.
* **coordinated**: the same with ``SharedDevice`` beside it: one ladder across the jobs
  (:mod:`lightning_bandlimit.tenants`).

Columns: over-budget steps (all jobs; a job's step is over when its peak plus the others'
memory at the step's start exceeds the budget), each job's accuracy minus its solo run, lever
changes per job and how many of them reverse the job's previous change (oscillation), steps on
a checkpointed rung and compressed, wall time of the set and the slowest job's over the
fastest's (starvation), and the host's combined resident peak, sampled every 20 ms, over the sum
of the jobs' own peaks (below 1: the jobs' step phases did not align; a GPU's caching allocators
would hold the sum). Writes
``benchmarks/results/<name>.json`` and ``<name>.png`` (the first seed's timelines, one panel per
row and set size).

Run: ``python -m benchmarks.tenants.cotrain`` (on 2 CPU cores about 20 minutes a seed with
the defaults, 2 and 3 jobs; ``--jobs 2 --seeds 0 --rows coordinated`` about 6).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time
from dataclasses import asdict
from pathlib import Path

import lightning
import torch

from benchmarks.common.plotting import pyplot
from benchmarks.common.provenance import RESULTS, stamp
from lightning_bandlimit.jobs.multitenant import (
    JobResult,
    JobSpec,
    adaptive_thresholds,
    launch,
    launch_set,
    over_budget,
    registered_memory,
)
from lightning_bandlimit.memory import RampTrace
from lightning_bandlimit.utils.files import atomic_write_json

MIB = 2**20
ROWS = ("plain", "independent", "coordinated")
NO_COTENANT = asdict(RampTrace(low=0, high=0))


class HostSampler(threading.Thread):
    """Samples the sum of the set's resident sets (the jobs registered in ``folder``) every
    ``interval`` seconds: the host's combined peak, whatever the phases of the jobs' steps."""

    def __init__(self, folder: Path, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.folder, self.interval = folder, interval
        self.peak = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.interval):
            total = sum(resident for resident, _ in registered_memory(self.folder))
            self.peak = max(self.peak, total)

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak


def _settings(result: JobResult) -> list[tuple[int, float]]:
    """What each step ran with: units checkpointed and compression (not the rung's number, which
    a first step profiled with every unit checkpointed reports as 0 before its stages are known)."""
    return [(r["checkpointed_units"], r["compression"]) for r in result.timeline]


def count_changes(result: JobResult) -> int:
    """How many times the job's steps ran with a different (rung, compression) than the step before."""
    settings = _settings(result)
    return sum(a != b for a, b in zip(settings, settings[1:]))


def count_reversals(result: JobResult) -> int:
    """Changes against the direction of the job's previous change (a climb after a release, or
    a release after a climb): the oscillation among the lever changes."""
    settings = _settings(result)
    ups = [b > a for a, b in zip(settings, settings[1:]) if a != b]
    return sum(x != y for x, y in zip(ups, ups[1:]))


def _plot(sets: list[dict], path: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(len(sets), 1, figsize=(9, 2.6 * len(sets)), squeeze=False)
    for ax, entry in zip(axes[:, 0], sets):
        for k, result in enumerate(entry["results"]):
            steps = [r["step"] for r in result.timeline]
            seen = [(r["job_bytes"] + r["peer_bytes"]) / MIB for r in result.timeline]
            ax.plot(steps, seen, label=f"job {k}: own + others", lw=1)
            marks = [s for s, r in zip(steps, result.timeline) if r["rung"] > 0 or r["compression"] > 0]
            ax.plot(marks, [min(seen)] * len(marks), "|", ms=6, label=f"job {k}: a lever on")
        ax.axhline(entry["budget"] / MIB, color="k", ls="--", lw=1, label="budget")
        ax.set_title(f"{entry['jobs']} jobs, {entry['row']}", fontsize=9)
        ax.set_ylabel("MiB")
        ax.legend(fontsize=6, ncol=3)
    axes[-1, 0].set_xlabel("step (each job's own)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--stagger", type=float, default=10.0, help="seconds between two jobs' starts")
    parser.add_argument("--below", type=float, default=0.4, help="budget shortfall, in one job's step memory")
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-size", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--work", type=Path, default=Path("runs/benchmark-cotrain"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--name", default="cotrain", help="file stem of the JSON and PNG written")
    args = parser.parse_args()
    if min(args.jobs) < 2:
        parser.error(f"--jobs counts the jobs sharing the device: 2 or more, got {args.jobs}")
    overrides = [
        *("--trainer.max_epochs", str(args.epochs)),
        *("--data.train_size", str(args.train_size)),
        *("--data.batch_size", str(args.batch_size)),
    ]
    rows: list[dict] = []
    plots: list[dict] = []
    started = time.perf_counter()
    for seed in args.seeds:
        work = args.work / f"seed{seed}"
        seeds = [100 * seed + k for k in range(max(args.jobs))]

        def spec(name: str, mode: str, out: Path, job_seed: int, **kwargs: object) -> JobSpec:
            return JobSpec(
                name,
                mode,
                str(out),
                NO_COTENANT,
                overrides=overrides,
                seed=job_seed,
                warm_data=True,
                **kwargs,
            )  # type: ignore[arg-type]

        solos: dict[int, list[JobResult]] = {}  # by threads: a job's result depends on its thread count
        for n in args.jobs:
            threads = max(1, (os.cpu_count() or 1) // n)
            if threads not in solos:
                solos[threads] = [
                    launch(
                        spec(f"solo{k}-t{threads}", "plain", work / f"solo{k}-t{threads}", s, threads=threads)
                    )
                    for k, s in enumerate(seeds)
                ]
                print(
                    f"seed {seed}: solo ({threads} threads) "
                    + ", ".join(f"{r.val_accuracy:.3f}" for r in solos[threads]),
                    flush=True,
                )
            solo = solos[threads]
            min_free, release_free = adaptive_thresholds(solo[0])
            budget = int(
                sum(r.peak_job_bytes for r in solo[:n])
                - args.below * statistics.fmean(r.step_increment_bytes for r in solo[:n])
            )
            for row in args.rows:
                out = work / f"{n}jobs" / row
                specs = [
                    spec(
                        f"job{k}",
                        "plain" if row == "plain" else "adaptive",
                        out / f"job{k}",
                        seeds[k],
                        budget=budget,
                        device=str(out / "device"),
                        coordinate=row == "coordinated",
                        threads=threads,
                        **(
                            {}
                            if row == "plain"
                            else {"compression": 0.0, "min_free": min_free, "release_free": release_free}
                        ),
                    )
                    for k in range(n)
                ]
                begin = time.perf_counter()
                sampler = HostSampler(out / "device" / "processes")
                sampler.start()
                try:
                    results = launch_set(specs, stagger_s=args.stagger)
                finally:
                    host_peak = sampler.stop()
                wall = time.perf_counter() - begin
                walls = [r.wall_s for r in results]
                record = {
                    "seed": seed,
                    "jobs": n,
                    "row": row,
                    "budget_mib": budget / MIB,
                    "over_budget_steps": sum(over_budget(r, budget) for r in results),
                    "accuracy_minus_solo": [r.val_accuracy - s.val_accuracy for r, s in zip(results, solo)],
                    "lever_changes": [count_changes(r) for r in results],
                    "lever_reversals": [count_reversals(r) for r in results],
                    "checkpointed_steps": [sum(x["rung"] > 0 for x in r.timeline) for r in results],
                    "compressed_steps": [sum(x["compression"] > 0 for x in r.timeline) for r in results],
                    "steps": [len(r.timeline) for r in results],
                    "set_wall_s": wall,
                    "job_wall_s": walls,
                    "slowest_over_fastest": max(walls) / min(walls),
                    "host_peak_mib": host_peak / MIB,
                    "sum_of_job_peaks_mib": sum(r.peak_job_bytes for r in results) / MIB,
                }
                rows.append(record)
                if seed == args.seeds[0]:
                    plots.append({"jobs": n, "row": row, "budget": budget, "results": results})
                print(
                    f"seed {seed}, {n} jobs, {row:>11}: over budget {record['over_budget_steps']:3d}, "
                    f"accuracy - solo {[f'{d:+.3f}' for d in record['accuracy_minus_solo']]}, "
                    f"changes {record['lever_changes']} (reversals {record['lever_reversals']}), "
                    f"compressed steps {record['compressed_steps']}, "
                    f"set wall {wall:.0f} s, slowest/fastest {record['slowest_over_fastest']:.2f}, "
                    f"host peak {record['host_peak_mib']:.0f} of {record['sum_of_job_peaks_mib']:.0f} MiB "
                    f"summed job peaks (budget {budget / MIB:.0f})",
                    flush=True,
                )
    summary = []
    for n in args.jobs:
        for row in args.rows:
            mine = [r for r in rows if r["jobs"] == n and r["row"] == row]
            summary.append(
                {
                    "jobs": n,
                    "row": row,
                    "seeds": len(mine),
                    "over_budget_steps": [r["over_budget_steps"] for r in mine],
                    "worst_accuracy_minus_solo": min(min(r["accuracy_minus_solo"]) for r in mine),
                    "mean_lever_changes_per_job": statistics.fmean(
                        c for r in mine for c in r["lever_changes"]
                    ),
                    "mean_lever_reversals_per_job": statistics.fmean(
                        c for r in mine for c in r["lever_reversals"]
                    ),
                    "mean_set_wall_s": statistics.fmean(r["set_wall_s"] for r in mine),
                    "worst_slowest_over_fastest": max(r["slowest_over_fastest"] for r in mine),
                    "host_peak_over_summed_job_peaks": [
                        r["host_peak_mib"] / r["sum_of_job_peaks_mib"] for r in mine
                    ],
                }
            )
    columns = ["jobs", "row", "over budget (per seed)", "worst acc - solo", "changes/job", "set wall s"]
    print("\n| " + " | ".join([*columns, "slowest/fastest"]) + " |")
    print("|---|---|---|---|---|---|---|")
    for s in summary:
        cells = [
            s["jobs"],
            s["row"],
            s["over_budget_steps"],
            f"{s['worst_accuracy_minus_solo']:+.3f}",
            f"{s['mean_lever_changes_per_job']:.1f}",
            f"{s['mean_set_wall_s']:.0f}",
            f"{s['worst_slowest_over_fastest']:.2f}",
        ]
        print("| " + " | ".join(map(str, cells)) + " |")
    args.output.mkdir(parents=True, exist_ok=True)
    _plot(plots, args.output / f"{args.name}.png")
    atomic_write_json(
        args.output / f"{args.name}.json",
        {
            **stamp(),
            "command": "python -m benchmarks.tenants.cotrain "
            + " ".join(
                f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                for k, v in vars(args).items()
                if k not in ("work", "output")
            ),
            "machine": {
                "platform": platform.platform(),
                "torch": torch.__version__,
                "lightning": lightning.__version__,
            },
            "minutes": (time.perf_counter() - started) / 60,
            "rows": rows,
            "summary": summary,
        },
        default=str,
    )


if __name__ == "__main__":
    main()
