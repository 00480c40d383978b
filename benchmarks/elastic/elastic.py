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
  this schedule is 2 processes without accumulation, like ``1-2-1``; ``exact-global-batch``
  chooses it too and is not run on this schedule, where it would repeat its ``1-2-1`` row).

Each resized schedule runs with every rule and with none: ``none`` (``NoScaling``: only data
position and schedule follow the resize), ``linear`` (``LinearScaling()``, 5-step re-warmup),
``keep-global-batch``, ``momentum`` (``MomentumAwareScaling()``), ``adascale`` (``AdaScale()``)
and ``exact-global-batch``: ``ExactGlobalBatch(--batch, micro_batches=[--batch // 2, --batch])``,
the fixed run's global batch kept exactly (1 process: ``--batch`` x 1; 2 processes: ``--batch // 2``
x accumulation 1, so the LR and schedule need no change; only BatchNorm sees micro-batches half
the size in the 2-process phase). Its runs are checked to have made every optimizer step of
exactly ``--batch`` samples, and each row records processes x micro-batch x accumulation per
phase. ``SquareRootScaling`` needs an Adam-family optimizer, so an ``adamw`` group repeats
``fixed``, ``none``, ``sqrt`` and ``exact-global-batch`` with the same model trained by AdamW and
the same ``SampleSchedule``. All rules use library defaults and the same base LR (``--lr-sgd`` 0.1, the
model's default; ``--lr-adamw`` 1e-2, picked once on a seed-0 *fixed* run from 2e-3 / 5e-3 /
1e-2, which reached 60 / 72 / 77 %): nothing is tuned per rule. The stability guard is on (the
default) and its rollbacks are reported.

How a resize is run: every phase is a fresh ``python -m benchmarks.elastic.elastic --worker JSON``
process (Lightning starts the second rank), as a torchrun restart would be. A phase ends at a
fixed number of samples seen: a callback saves the checkpoint from ``on_train_batch_end`` right
after the optimizer step that reaches it (all ranks; mid-epoch) and stops; the next phase
resumes from it with ``trainer.fit(..., ckpt_path=...)``. Phase ends are the thirds of the
budget rounded to a multiple of the largest global batch, so every phase ends on an optimizer
step. Every run is checked to have seen exactly the planned number of samples and each training
sample exactly once per epoch (each rank records the indices of the images it trained on).
The first phase does not depend on the rule (``exact-global-batch`` plans ``--batch`` x 1 on 1
process, checked before any launch), so it runs once per optimizer and seed and every resized run
resumes from its checkpoint; its wall time is counted in every run's total. The
package is copied at the start and every launch imports that copy (the working tree may change
under a long run); each launch records a fingerprint of the sources it ran (``strategies``,
``models``, ``data``, ``callbacks``) and the benchmark stops if one differs from the copy's.

Determinism and cost: the seed sets ``seed_everything`` (model init, sampler order) and the data
module's seed. Images are rendered once per seed (in a process on the copy, as the launches run)
and handed to the workers (the data module's cache is pre-filled), so a launch does not spend its
time drawing images. Each process uses one intra-op thread (``ElasticDDPStrategy(cpu_threads=1)``):
on a shared 2-core machine two threads per process are much slower under load, and one thread
keeps the 1- and 2-process phases comparable. Wall time per run is the sum over its launches of
the launch's wall clock (process start to exit, including imports and process-group set-up), so a
resized run pays three start-ups against the fixed run's one.

Statistics: every resized row is compared with the fixed run of the same seed and optimizer. The
table gives the paired difference (points), its mean +- std over the ``n`` seeds and the 95 %
Student-t interval ``mean +- t(0.975, n-1) std / sqrt(n)``; the verdict is "within 0.5" only
when the whole interval lies inside [-0.5, +0.5], "outside" when it lies entirely beyond it, and
"unresolved" otherwise: never a yes/no from the point estimate. With 5 seeds and a paired std of
s points the half-width is about 1.24 s, so a row resolves "within" only if s is below ~0.4.

Caveats for reading the result: AdaScale
advances the schedule by its measured gain rather than by samples, so under a fixed *sample*
budget its cosine has not finished when the budget ends (its final schedule position is in the
JSON). When the stability guard rolls a resize back, the model, optimizer and schedule return
to their state at the resize but the data position and samples seen do not, so that run's
schedule ends behind its budget (final LR above the schedule's minimum; see ``final_lr``,
``schedule_progress`` and ``rollbacks`` per phase in the JSON).

Output: a table on stdout (optimizer x schedule x rule: processes x micro-batch x accumulation per
phase, n, val accuracy mean +- std over seeds, the paired difference mean +- std, its 95 %
interval, the verdict, wall time), ``benchmarks/results/elastic.json`` (configuration, versions,
every per-seed, per-phase record, the table rows with the per-seed differences and interval) and
``elastic.png`` next to it (per optimizer, top: val accuracy mean +- std per rule and schedule
with the fixed run's mean as a line in a +-0.5-point band; bottom: the paired difference to the
fixed run of the same seed, mean and 95 % interval, against the band 0 +- 0.5).

Run from the repository root::

    # full run (5 seeds, all rules; about 35 min on 2 busy cores; the plan and an estimate are printed first):
    .venv/bin/python -m benchmarks.elastic.elastic
    .venv/bin/python -m benchmarks.elastic.elastic --quick  # smoke run, ~1 minute
    # a reduced set:
    .venv/bin/python -m benchmarks.elastic.elastic --optimizers sgd --schedules 1-2-1 \
        --rules none linear keep-global-batch exact-global-batch
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common.provenance import REPO_ROOT, stamp
from benchmarks.elastic.plan import (
    ALL_RULES,
    DEFAULT_OUTPUT,
    FINGERPRINTED,
    OPTIMIZERS,
    SCHEDULES,
    TARGET_POINTS,
)
from benchmarks.elastic.report import format_table, plot, summarize, versions
from benchmarks.elastic.runs import Bench, estimate_seconds, plan, render_data, render_in_snapshot
from benchmarks.elastic.worker import worker
from lightning_bandlimit.utils.files import atomic_write_json


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--render", nargs=2, help=argparse.SUPPRESS)  # [seed, train, val] JSON, path
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: seed 0, 1-4x-1 with linear and sqrt, tiny budget"
    )
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=None, help="default: 0 1 2 3 4 (0 with --quick)"
    )
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
        "seeds": [0] if quick else [0, 1, 2, 3, 4],
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
    if args.render is not None:
        render_data(*json.loads(args.render[0]), Path(args.render[1]))
        return
    started = time.perf_counter()
    info = versions()  # at the start: the commit the library snapshot is taken from
    runs = plan(args)
    if not runs:
        raise SystemExit("nothing to run: no rule applies to the chosen optimizers")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="elastic-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    bench = Bench(args, workdir)
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
    for optimizer, schedule, rule in runs:
        print(f"  {optimizer:<6} {schedule:<7} {rule}", flush=True)
    estimate = estimate_seconds(runs, len(args.seeds), bench.total, bench.ends)
    print(f"estimated wall time ~{estimate / 60:.0f} min (per-launch times of a past run on 2 busy cores)")
    results: list[dict[str, Any]] = []
    try:
        for seed in args.seeds:
            t = time.perf_counter()
            # rendered with the snapshot, as the launches run, not with the working tree's package
            render_in_snapshot(
                seed, args.train_size, args.val_size, workdir / f"data-seed{seed}.pt", bench.snapshot
            )
            print(f"seed {seed}: rendered data in {time.perf_counter() - t:.1f} s", flush=True)
            for optimizer, schedule, rule in runs:
                result = bench.run(optimizer, schedule, rule, seed)
                results.append(result)
                print(
                    f"  {optimizer:<6} {schedule:<7} {rule:<18} seed {seed}: val acc "
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
    print(f"\ntarget: the paired difference's 95 % interval inside +-{TARGET_POINTS} points of the fixed run")
    for verdict in sorted({r["verdict"] for r in rows if r["verdict"] is not None}):
        names = [f"{r['optimizer']} {r['schedule']} {r['rule']}" for r in rows if r["verdict"] == verdict]
        print(f"  {verdict}: {', '.join(names)}")
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
    atomic_write_json(args.output, {**stamp("benchmarks.elastic.elastic", argv), **report})
    plot(rows, args.output.with_suffix(".png"))
    print(f"wrote {args.output} and {args.output.with_suffix('.png')}")


if __name__ == "__main__":
    main()
