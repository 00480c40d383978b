"""Resident step memory on every point of the ladder: checkpointed stages x compression.

The quickstart model as the recipe trains it (``ImageClassifier``: its normalisation, then the
CIFAR ResNet-18 width 8; memory-lean band-limited layers, batch 256, SGD with momentum) trained
on one synthetic batch (the normalisation inside the model matters: the stem then reads a
temporary, not the batch the caller holds, so its kept spectrum is not a second copy); for each
compression and each rung (the first ``r`` stages checkpointed, as ``AdaptiveBandLimit`` does)
the growth of the resident set within a training step (peak minus the step's start, ``/proc``;
the minimum of the last ``--repeats - 1`` steps) and the bytes saved for backward
(deterministic). Also the plain
``nn.Conv2d`` model, with no unit and with every unit checkpointed, as the baseline a user
would otherwise run. The process re-runs itself with ``MALLOC_MMAP_THRESHOLD_=131072`` (as the
multi-tenant jobs do) so that freed tensors leave the resident set.

The curve's targets (issue 35) are printed per rung: the step peak at each compression at most
that at the compression below plus 1 MiB (noise), and below the c = 0 peak from c = 0.2 on.

With ``--splits 1 2 4 8`` also the micro-batch lever (``lightning_bandlimit.microbatch``): the
band-limited model at c = 0 on rung 0 and on the top rung, its step's batch run in ``k`` chunks
(:func:`~lightning_bandlimit.microbatch.split_batch`) as ``SplitStep`` runs it: the gradients
zeroed once, each chunk's forward and backward with its loss weighted by its share of the batch,
the optimizer stepping once. Per rung and split: the same step growth, the bytes saved for
backward by the largest chunk (one chunk's graph lives at a time), and the median step time
(after one untimed step: the first step at a shape costs seconds; the growth the minimum of the
``--repeats`` steps), printed relative to split 1 on the same rung
(measured whether asked or not) and written to the JSON's ``splits`` rows.

Run: ``python -m benchmarks.memory.ladder_memory`` (the quickstart model, c = 0, 0.1, ...,
0.9: about 10 minutes on 2 CPU cores) and ``... --width 64 --batch 32 --ends --output
benchmarks/results/ladder_memory_w64.json`` (rung 0 and the top rung only); writes the JSON and
prints the table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.common.environment import RESIDENT_MALLOC, restart_with
from benchmarks.common.provenance import RESULTS, command, stamp
from lightning_bandlimit.layers.surgery import bandlimit, set_compression
from lightning_bandlimit.memory.process import peak_resident_bytes, reset_peak_resident, resident_bytes
from lightning_bandlimit.microbatch import split_batch
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.recompute.rungs import CheckpointRungs
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter
from lightning_bandlimit.recompute.unit_choice import checkpoint_units
from lightning_bandlimit.utils.files import atomic_write_json
from lightning_bandlimit.utils.versions import library_versions

MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument(
        "--compressions", type=float, nargs="+", default=[round(0.1 * i, 1) for i in range(10)]
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--ends",
        action="store_true",
        help="band-limited model on rung 0 and the top rung only (the issue's curve; the width-64 "
        "model's every rung takes over an hour on 2 CPU cores)",
    )
    parser.add_argument(
        "--splits",
        type=int,
        nargs="+",
        default=[],
        help="also the micro-batch split: the band-limited model at c = 0 on rung 0 and the top rung, "
        "its batch in each of these numbers of chunks (split 1 always measured; default: none)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "ladder_memory.json")
    args = parser.parse_args()
    if any(k < 1 for k in args.splits):
        parser.error(f"--splits must be at least 1, got {args.splits}")
    restart_with(RESIDENT_MALLOC, "benchmarks.memory.ladder_memory")

    torch.manual_seed(0)
    x, y = torch.rand(args.batch, 3, 32, 32), torch.randint(0, 10, (args.batch,))

    def measure(model: nn.Module, stages: CheckpointRungs, rung: int) -> dict[str, float]:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        stages.apply(rung)
        growth = []
        for _ in range(args.repeats):
            reset_peak_resident()
            start = resident_bytes()
            with SavedTensorMeter(exclude=model.parameters()) as meter:
                loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            growth.append((peak_resident_bytes() - start) / MIB)
        return {"step_growth_mib": min(growth[1:] or growth), "saved_mib": meter.bytes / MIB}

    def staged(model: nn.Module) -> CheckpointRungs:
        stages = CheckpointRungs(checkpoint_units(model))
        with stages.profile(exclude=model.parameters()) as profile:
            model(x[:2])
        stages.set_stages(profile.stages())
        return stages

    rows = []
    plain = ImageClassifier("cifar_resnet18", width=args.width).train()
    plain_stages = staged(plain)
    rungs = len(plain_stages.stages or [])
    for rung in (0, rungs):
        rows.append(
            {
                "model": "plain nn.Conv2d",
                "compression": None,
                "rung": rung,
                **measure(plain, plain_stages, rung),
            }
        )
    lean = ImageClassifier("cifar_resnet18", width=args.width).train()
    bandlimit(lean, 0.0)
    lean_stages = staged(lean)
    for c in args.compressions:
        set_compression(lean, c)
        for rung in (0, rungs) if args.ends else range(rungs + 1):
            rows.append(
                {"model": "band-limited", "compression": c, "rung": rung, **measure(lean, lean_stages, rung)}
            )

    print(f"resident step growth MiB (saved for backward MiB), batch {args.batch}, width {args.width}")
    print(f"{'model':<16} {'compression':>11} " + " ".join(f"{f'rung {r}':>15}" for r in range(rungs + 1)))
    for model, c in [("plain nn.Conv2d", None), *(("band-limited", c) for c in args.compressions)]:
        cells = {r["rung"]: r for r in rows if r["model"] == model and r["compression"] == c}
        texts = [
            f"{cells[r]['step_growth_mib']:.0f} ({cells[r]['saved_mib']:.0f})" if r in cells else "-"
            for r in range(rungs + 1)
        ]
        line = " ".join(f"{text:>15}" for text in texts)
        print(f"{model:<16} {'-' if c is None else c:>11} {line}")
    verdicts = curve_verdicts(rows, rungs)
    for line in verdicts["lines"]:
        print(line)
    extra: dict[str, Any] = {}
    if args.splits:
        set_compression(lean, 0.0)
        splits = sorted({1, *args.splits})
        split_rows = []
        for rung in (0, rungs):
            for k in splits:
                split_rows.append(
                    {
                        "model": "band-limited",
                        "compression": 0.0,
                        "rung": rung,
                        "split": k,
                        **measure_split(lean, lean_stages, rung, x, y, k, args.repeats),
                    }
                )
        relative_to_split1(split_rows)
        print_splits(split_rows, args.batch, args.width)
        extra["splits"] = split_rows
    atomic_write_json(
        args.output,
        {
            "curve_verdicts": verdicts,
            "command": command("benchmarks.memory.ladder_memory", sys.argv[1:]),
            **stamp(),
            "batch": args.batch,
            "width": args.width,
            "stages": plain_stages.stages,
            "rows": rows,
            "env": RESIDENT_MALLOC,
            "threads": torch.get_num_threads(),
            "versions": library_versions(),
            **extra,
        },
    )
    print(f"wrote {args.output}")


def measure_split(
    model: nn.Module,
    stages: CheckpointRungs,
    rung: int,
    x: torch.Tensor,
    y: torch.Tensor,
    split: int,
    repeats: int,
) -> dict[str, float]:
    """One training step in ``split`` chunks, as ``SplitStep`` runs it (each chunk's loss weighted
    by its share, back-propagated chunk by chunk into the same gradients, one optimizer step, the
    gradients zeroed once: after the step, as :func:`main`'s ``measure`` does), once to warm up
    (the first step at a shape costs seconds) and ``repeats`` times: the resident growth within
    the step (the minimum of the repeats), the bytes the largest chunk saves for backward and the
    median step time (of the repeats)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    stages.apply(rung)
    growth, seconds = [], []
    chunks = saved = 0
    for _ in range(1 + repeats):  # a first step at the chunks' shape to warm up, not counted
        reset_peak_resident()
        start = resident_bytes()
        began = time.perf_counter()
        parts = split_batch((x, y), split)
        chunks, saved = len(parts), 0
        for (xc, yc), count in parts:
            with SavedTensorMeter(exclude=model.parameters()) as meter:
                loss = nn.functional.cross_entropy(model(xc), yc)
            (loss * (count / x.shape[0])).backward()
            saved = max(saved, meter.bytes)
            del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # as measure(): no gradient held at the step's start
        seconds.append(time.perf_counter() - began)
        growth.append((peak_resident_bytes() - start) / MIB)
        del parts
    return {
        "chunks": chunks,
        "step_growth_mib": min(growth[1:]),
        "saved_mib": saved / MIB,
        "step_ms": 1e3 * statistics.median(seconds[1:]),
    }


def relative_to_split1(rows: list[dict]) -> None:
    """Each row's growth, bytes saved and step time over split 1's on the same rung."""
    base = {r["rung"]: r for r in rows if r["split"] == 1}
    for row in rows:
        one = base[row["rung"]]
        for key, name in (("step_growth_mib", "growth"), ("saved_mib", "saved"), ("step_ms", "time")):
            row[f"{name}_vs_split1"] = row[key] / one[key] if one[key] else None


def print_splits(rows: list[dict], batch: int, width: int) -> None:
    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    print(
        f"micro-batch split, band-limited c = 0, batch {batch}, width {width}: resident step growth "
        "MiB, saved for backward MiB (largest chunk), median step ms; x: over split 1 on the rung"
    )
    print(f"{'rung':>4} {'split':>5} {'growth':>13} {'saved':>13} {'step ms':>14}")
    for r in rows:
        print(
            f"{r['rung']:>4} {r['split']:>5} "
            f"{r['step_growth_mib']:>6.1f} {'x' + ratio(r['growth_vs_split1']):>6} "
            f"{r['saved_mib']:>6.1f} {'x' + ratio(r['saved_vs_split1']):>6} "
            f"{r['step_ms']:>7.0f} {'x' + ratio(r['time_vs_split1']):>6}"
        )


def curve_verdicts(rows: list[dict], rungs: int, noise_mib: float = 1.0) -> dict:
    """Per rung of the band-limited model: compressions whose step growth exceeds the one below
    it by more than ``noise_mib``, and those from 0.2 on not below the c = 0 growth."""
    result: dict = {"rising": {}, "not_below_c0": {}, "lines": []}
    for rung in range(rungs + 1):
        curve = sorted(
            (r["compression"], r["step_growth_mib"])
            for r in rows
            if r["model"] == "band-limited" and r["rung"] == rung
        )
        if not curve:  # not measured (--ends)
            continue
        rising = [c for (_, a), (c, b) in zip(curve, curve[1:]) if b > a + noise_mib]
        base = dict(curve).get(0.0)
        high = [c for c, m in curve if c >= 0.2 - 1e-9 and base is not None and m >= base]
        result["rising"][rung], result["not_below_c0"][rung] = rising, high
        result["lines"].append(
            f"rung {rung}: rises by more than {noise_mib} MiB at c = {rising or 'none'}; "
            f"not below c = 0 from c = 0.2 on at c = {high or 'none'}"
        )
    return result


if __name__ == "__main__":
    main()
