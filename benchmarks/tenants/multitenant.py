"""A training job beside a real co-tenant on a shared memory budget: the ladder against what users run.

Every job is the ``quickstart`` recipe (CIFAR ResNet-18 width 8, synthetic data, CPU) trained in
its own process beside a co-tenant process whose resident memory follows a ramp: low, up a
quarter into the run, held, gone at 70 % (:mod:`lightning_bandlimit.jobs.multitenant`). Both
processes' memory is measured in ``/proc`` every step, never modelled; the job processes run
with ``MALLOC_MMAP_THRESHOLD_=131072`` so that freed tensors leave the resident set (every job:
like for like).

Per seed (same data, another training seed), the rows:

* **plain**: the recipe with plain ``nn.Conv2d``, no callback (what the user would otherwise run).
  Its accuracy is also plain-without-pressure. Two budgets are chosen from its measurement
  (``budget_for``): **today's trace** leaves it ``--below`` (0.2) of its step memory short at
  the co-tenant's peak, the **deep trace** ``--deep-below`` (0.5) short: more than
  checkpointing every block frees (0.45 of it, ``ladder_memory.py``), so the compression must
  engage.
* **checkpointed**: the plain model with every residual block always checkpointed
  (``torch.utils.checkpoint``, non-reentrant; no callback): what a user could do instead.
* **ladder**: ``AdaptiveBandLimit`` with its three levers (checkpointing, the micro-batch split,
  the compression) from compression 0, on each budget.
* **ladder, no split** (deep trace): the ladder without the micro-batch lever (checkpointing,
  then the compression), as it was before the lever.
* **compression-only**: ``AdaptiveBandLimit(levers=["compression"])`` from ``--floor`` (default
  0, like the ladder), on each budget.
* **ladder, no pressure**: the ladder on a budget four times the held memory: it never acts, so
  its step time over plain's is the cost of being there.
* **the step traces**: the same co-tenant taking its whole peak within one step (a job starting
  up), on today's shortfall (``--below``): less than checkpointing frees, so the ladder should
  absorb it with exact rungs alone. **step**: at 45 % of the run, after the job's own memory
  stopped growing; **early**: at 25 %, in the first epoch, while the job's own memory still grows
  (the synthetic dataset caches what it loads, as a real one's page cache or a GPU job's
  allocator does; no ``warm_data``): the ladder must judge each rung by what it changes, not by
  that drift. Each has its own plain run setting its budget; rows plain, ladder and
  compression-only. The step on which the co-tenant jumps is over budget before any check can
  see it (the verdict allows that one).

The plain and checkpointed jobs do not react to memory, so one run of each is counted against
both budgets (same co-tenant trace). Per row and trace: over-budget steps per seed, accuracy,
paired differences to plain (and ladder minus compression-only) with 95 % Student-t intervals,
wall and step time over plain's. The verdicts (the targets of the ladder issue) come from these
rows. Writes ``benchmarks/results/<name>.json`` and ``<name>.png`` (the first seed's timelines
on today's trace; ``--name``, default ``multitenant``).

Run: ``python -m benchmarks.tenants.multitenant`` (about 47 minutes on 2 CPU cores with the
defaults, the main job's training: 3 seeds x 13 jobs x 3 epochs of 8192 images in batches of 256);
``--traces early step`` runs only those (the plain, checkpointed and no-pressure rows come with
``today`` or ``deep``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.common.provenance import RESULTS, stamp, versions
from benchmarks.common.stats import PairedDifference
from lightning_bandlimit.jobs.multitenant import (
    HOST_ALLOCATOR_ENV,
    JobResult,
    JobSpec,
    adaptive_thresholds,
    budget_for,
    launch,
    over_budget,
    plot_timelines,
)
from lightning_bandlimit.memory import RampTrace
from lightning_bandlimit.utils.files import atomic_write_json

MIB = 2**20
TRACES = ("today", "deep", "step", "early")
LADDER = ["checkpoint", "microbatch", "compression"]
NO_SPLIT = ["checkpoint", "compression"]
STEP_TRACES = ("step", "early")
STEP_RAMP = 0.001  # the step traces' rise: within one step of the run


def _interval(d: PairedDifference) -> str:
    if d.n < 2:
        return f"{d.mean:+.1f} (1 seed: no interval)"
    return f"{d.mean:+.1f} +- {d.std:.1f} [{d.low:+.1f}, {d.high:+.1f}]"


def _ratio(values: list[float]) -> str:
    return f"{statistics.fmean(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def _range(result: JobResult, key: str) -> list[float]:
    values = [r.get(key, 0) for r in result.timeline]
    return [min(values), max(values)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-size", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--recalibrate-bn", type=int, default=2, help="BatchNorm re-estimate batches")
    parser.add_argument(
        "--floor", type=float, default=0.0, help="the compression-only job's least compression"
    )
    parser.add_argument("--low-mib", type=float, default=32.0, help="co-tenant before and after its peak")
    parser.add_argument("--high-mib", type=float, default=192.0, help="co-tenant at its peak")
    parser.add_argument(
        "--below", type=float, default=0.2, help="today's budget shortfall, in plain step memory"
    )
    parser.add_argument("--deep-below", type=float, default=0.5, help="the deep trace's budget shortfall")
    parser.add_argument("--work", type=Path, default=Path("runs/benchmark-multitenant"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--name", default="multitenant", help="file stem of the JSON and PNG written")
    parser.add_argument("--traces", nargs="+", choices=TRACES, default=list(TRACES), help="traces to run")
    args = parser.parse_args()
    traces = [t for t in TRACES if t in args.traces]

    ramp = RampTrace(low=int(args.low_mib * MIB), high=int(args.high_mib * MIB))
    trace = asdict(ramp)
    steps = {  # the co-tenant jumping after the job's own growth, and during it
        "step": RampTrace(
            ramp.low, ramp.high, start=ramp.start + ramp.ramp, ramp=STEP_RAMP, leave=ramp.leave
        ),
        "early": RampTrace(ramp.low, ramp.high, start=ramp.start, ramp=STEP_RAMP, leave=ramp.leave),
    }
    overrides = [
        "--trainer.max_epochs",
        str(args.epochs),
        "--data.train_size",
        str(args.train_size),
        "--data.batch_size",
        str(args.batch_size),
    ]
    ramps = [t for t in traces if t not in STEP_TRACES]
    jumps = [t for t in traces if t in STEP_TRACES]
    per_seed = (2 + ("today" in ramps) + 2 * len(ramps) + ("deep" in ramps) if ramps else 0) + 3 * len(jumps)
    print(
        f"plan: {len(args.seeds)} seeds x (plain, checkpointed, ladder no pressure, and ladder + "
        f"compression-only on {ramps}; plain, ladder and compression-only on {jumps}) = "
        f"{per_seed * len(args.seeds)} jobs",
        flush=True,
    )
    started = time.perf_counter()
    rows: list[dict] = []
    first: list[JobResult] = []
    first_budget, first_trace = 0, traces[0]

    def record(seed: int, trace_name: str, setting: str, result: JobResult, budget: int) -> None:
        row = {k: v for k, v in asdict(result).items() if k != "timeline"}
        row.update(
            seed=seed,
            trace=trace_name,
            setting=setting,
            budget_bytes=budget,
            over_budget_steps=over_budget(result, budget),
            steps=len(result.timeline),
            rung_range=_range(result, "rung"),
            checkpointed_units_range=_range(result, "checkpointed_units"),
            compression_range=_range(result, "compression"),
            split_range=_range(result, "split"),
        )
        rows.append(row)
        print(
            f"seed {seed} {trace_name:<6} {setting:<20} acc {result.val_accuracy:.3f}  over budget "
            f"{row['over_budget_steps']:>3}/{row['steps']}  peak {result.peak_job_bytes / MIB:.0f} MiB  step "
            f"{result.step_ms:.0f} ms  wall {result.wall_s:.0f} s  rung {row['rung_range']}  c "
            f"{row['compression_range']}  split {row['split_range']}",
            flush=True,
        )

    for seed in args.seeds:
        seeded = [*overrides, "--seed_everything", str(seed)]
        work = args.work / f"seed{seed}"

        def adaptive(
            name: str,
            budget: int,
            levers: list[str],
            floor: float,
            thresholds: tuple[int, int],
            cotenant: dict | None = None,
        ) -> JobResult:
            return launch(
                JobSpec(
                    name,
                    "adaptive",
                    str(work / name.replace(" ", "-").replace(",", "")),
                    trace if cotenant is None else cotenant,
                    overrides=seeded,
                    compression=floor,
                    max_compression=0.9,
                    budget=budget,
                    min_free=thresholds[0],
                    release_free=thresholds[1],
                    recalibrate_bn=args.recalibrate_bn,
                    levers=levers,
                )
            )

        budgets: dict[str, int] = {}
        if ramps:
            plain = launch(JobSpec("plain", "plain", str(work / "plain"), trace, overrides=seeded))
            checkpointed = launch(
                JobSpec("checkpointed", "checkpointed", str(work / "checkpointed"), trace, overrides=seeded)
            )
            thresholds = adaptive_thresholds(plain)
            budgets = {
                "today": budget_for(plain, ramp, below=args.below),
                "deep": budget_for(plain, ramp, below=args.deep_below),
            }
            budgets = {t: b for t, b in budgets.items() if t in ramps}
        if "today" in ramps:
            roomy = 4 * budget_for(plain, ramp, below=0.01)
            idle = adaptive("ladder no pressure", roomy, LADDER, 0.0, thresholds)
            record(seed, "none", "ladder, no pressure", idle, roomy)
        for trace_name, budget in budgets.items():
            record(seed, trace_name, "plain", plain, budget)
            record(seed, trace_name, "checkpointed", checkpointed, budget)
            ladder = adaptive(f"ladder {trace_name}", budget, LADDER, 0.0, thresholds)
            record(seed, trace_name, "ladder", ladder, budget)
            if trace_name == "deep":
                unsplit = adaptive(f"ladder no split {trace_name}", budget, NO_SPLIT, 0.0, thresholds)
                record(seed, trace_name, "ladder, no split", unsplit, budget)
            limited = adaptive(
                f"compression-only {trace_name}", budget, ["compression"], args.floor, thresholds
            )
            record(seed, trace_name, "compression-only", limited, budget)
            if not first:
                first, first_budget, first_trace = [plain, checkpointed, ladder, limited], budget, trace_name
        for trace_name in jumps:
            jump = steps[trace_name]
            plain_step = launch(
                JobSpec(
                    f"plain {trace_name}",
                    "plain",
                    str(work / f"plain-{trace_name}"),
                    asdict(jump),
                    overrides=seeded,
                )
            )
            step_budget = budget_for(plain_step, jump, below=args.below)
            record(seed, trace_name, "plain", plain_step, step_budget)
            results = [plain_step]
            for setting, levers in (
                ("ladder", LADDER),
                ("compression-only", ["compression"]),
            ):
                result = adaptive(
                    f"{setting} {trace_name}",
                    step_budget,
                    levers,
                    0.0,
                    adaptive_thresholds(plain_step),
                    asdict(jump),
                )
                record(seed, trace_name, setting, result, step_budget)
                results.append(result)
            if not first:
                first, first_budget, first_trace = results, step_budget, trace_name

    def cell(trace_name: str, setting: str) -> dict[int, dict]:
        return {r["seed"]: r for r in rows if r["trace"] == trace_name and r["setting"] == setting}

    summary: list[dict] = []
    lines = [
        f"{'trace':<6} {'setting':<20} {'over budget':>11} {'val acc':>15} "
        f"{'acc - plain, points (95 % CI)':>32} {'wall / plain':>17} {'step / plain':>17} {'units':>6} "
        f"{'compression':>11} {'split':>5}"
    ]
    for trace_name in traces:
        plain_rows = cell(trace_name, "plain")
        for setting in ("plain", "checkpointed", "ladder", "ladder, no split", "compression-only"):
            group = cell(trace_name, setting)
            if not group:
                continue  # no checkpointed row on the step trace
            seeds = sorted(group)
            diff = PairedDifference.of(
                [100 * (group[s]["val_accuracy"] - plain_rows[s]["val_accuracy"]) for s in seeds], target=1.0
            )
            entry = {
                "trace": trace_name,
                "setting": setting,
                "seeds": seeds,
                "over_budget_steps": [group[s]["over_budget_steps"] for s in seeds],
                "val_accuracy": [group[s]["val_accuracy"] for s in seeds],
                "accuracy_minus_plain_points": asdict(diff),
                "wall_over_plain": [group[s]["wall_s"] / plain_rows[s]["wall_s"] for s in seeds],
                "step_over_plain": [group[s]["step_ms"] / plain_rows[s]["step_ms"] for s in seeds],
                "rung_max": max(group[s]["rung_range"][1] for s in seeds),
                "checkpointed_units_max": max(group[s]["checkpointed_units_range"][1] for s in seeds),
                "compression_max": max(group[s]["compression_range"][1] for s in seeds),
                "split_max": max(group[s].get("split_range", [1, 1])[1] for s in seeds),
            }
            summary.append(entry)
            accs = entry["val_accuracy"]
            spread = (
                f"{statistics.fmean(accs):.3f} +- {statistics.stdev(accs):.3f}"
                if len(accs) > 1
                else f"{accs[0]:.3f}"
            )
            over = "/".join(map(str, entry["over_budget_steps"]))
            versus = _interval(diff) if setting != "plain" else "-"
            lines.append(
                f"{trace_name:<6} {setting:<20} {over:>11} {spread:>15} {versus:>32} "
                f"{_ratio(entry['wall_over_plain']):>17} {_ratio(entry['step_over_plain']):>17} "
                f"{entry['checkpointed_units_max']:>6} {entry['compression_max']:>11.2f} "
                f"{entry['split_max']:>5}"
            )
    idle = cell("none", "ladder, no pressure")
    plain_today = cell("today", "plain")
    idle_ratio = [idle[s]["step_ms"] / plain_today[s]["step_ms"] for s in sorted(idle)]
    if idle:
        idle_rungs = sorted({idle[s]["rung_range"][1] for s in idle})
        idle_compressions = sorted({idle[s]["compression_range"][1] for s in idle})
        lines.append(
            f"no pressure: the ladder's median step time over plain's {_ratio(idle_ratio)}; highest rung "
            f"{idle_rungs}, highest compression {idle_compressions}"
        )
    ladder_vs_limited = {}
    for trace_name in traces:
        ladder, limited = cell(trace_name, "ladder"), cell(trace_name, "compression-only")
        ladder_vs_limited[trace_name] = PairedDifference.of(
            [100 * (ladder[s]["val_accuracy"] - limited[s]["val_accuracy"]) for s in sorted(ladder)],
            target=1.0,
        )
        lines.append(
            f"{trace_name}: ladder - compression-only, points: {_interval(ladder_vs_limited[trace_name])}"
        )

    def entry(trace_name: str, setting: str) -> dict:
        return next(e for e in summary if e["trace"] == trace_name and e["setting"] == setting)

    verdicts: dict[str, bool] = {}
    if "today" in traces:
        today_ladder = entry("today", "ladder")
        today_diff = PairedDifference(**today_ladder["accuracy_minus_plain_points"])
        verdicts |= {
            "today: ladder 0 over-budget steps in every seed": all(
                n == 0 for n in today_ladder["over_budget_steps"]
            ),
            "today: ladder within 1 point of plain (paired mean)": today_diff.mean >= -1.0,
            "today: ladder wall time <= 1.15x plain (mean)": statistics.fmean(today_ladder["wall_over_plain"])
            <= 1.15,
            "today: plain over budget in every seed": all(
                n > 0 for n in entry("today", "plain")["over_budget_steps"]
            ),
            "no pressure: ladder step time <= 1.03x plain (mean)": statistics.fmean(idle_ratio) <= 1.03,
        }
    if "deep" in traces:
        deep_ladder = entry("deep", "ladder")
        deep_diff = PairedDifference(**deep_ladder["accuracy_minus_plain_points"])
        verdicts |= {
            "deep: ladder 0 over-budget steps in every seed": all(
                n == 0 for n in deep_ladder["over_budget_steps"]
            ),
            "deep: ladder within 2 points of plain (paired mean)": deep_diff.mean >= -2.0,
            "deep: ladder keeps compression 0 (exact levers only)": deep_ladder["compression_max"] == 0,
            "deep: checkpointing alone over budget in every seed": all(
                n > 0 for n in entry("deep", "checkpointed")["over_budget_steps"]
            ),
            "deep: ladder not resolvably below compression-only (interval not all below 0)": (
                ladder_vs_limited["deep"].high >= 0
            ),
        }
    for trace_name in jumps:
        jumped = entry(trace_name, "ladder")
        jump_diff = PairedDifference(**jumped["accuracy_minus_plain_points"])
        verdicts |= {
            f"{trace_name}: ladder at most the jump's own step over budget in every seed": all(
                n <= 1 for n in jumped["over_budget_steps"]
            ),
            f"{trace_name}: ladder absorbs it with exact rungs (compression stays 0)": (
                jumped["compression_max"] == 0
            ),
            f"{trace_name}: ladder within 1 point of plain (paired mean)": jump_diff.mean >= -1.0,
        }
    lines += [f"{key}: {'PASS' if ok else 'FAIL'}" for key, ok in verdicts.items()]
    print("\n" + "\n".join(lines))
    args.output.mkdir(parents=True, exist_ok=True)
    report = {
        "command": "python -m benchmarks.tenants.multitenant "
        + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items()
            if k not in ("work", "output", "name")
        ),
        "trace": trace,
        "step_traces": {name: asdict(jump) for name, jump in steps.items() if name in traces},
        "overrides": overrides,
        "host_allocator_env": HOST_ALLOCATOR_ENV,
        "rows": rows,
        "summary": summary,
        "ladder_minus_compression_only_points": {k: asdict(v) for k, v in ladder_vs_limited.items()},
        "no_pressure_step_over_plain": idle_ratio,
        "table": lines,
        "verdicts": verdicts,
        "wall_s": time.perf_counter() - started,
        "versions": versions(),
        "threads": torch.get_num_threads(),
    }
    json_path, png_path = args.output / f"{args.name}.json", args.output / f"{args.name}.png"
    atomic_write_json(json_path, {**report, **stamp()})
    plot_timelines(
        first,
        first_budget,
        png_path,
        title=f"seed {args.seeds[0]}, the {first_trace} trace: quickstart beside a co-tenant",
    )
    print(f"wrote {json_path} and {png_path} ({report['wall_s'] / 60:.1f} min)")


if __name__ == "__main__":
    main()
