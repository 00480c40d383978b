"""The model-zoo support matrix: every zoo model through every lever, and what c = 0.5 costs.

Runs the conformance cells of ``tests/zoo`` (``tests/zoo/cells.py``; the models are
``tests/zoo/models.py``'s table) on each model, in this process, and prints a Markdown table,
models grouped by family:

* one column per cell, ``ok`` / ``FAIL`` / ``-`` (not run on this model: ``compile`` and
  ``ladder_in_trainer`` run on a few models, as in the test suite; ``--all-cells`` runs them on
  every model);
* ``rungs``: the exact checkpointing rungs (stages) found at c = 0 (``rungs_exact_c0``);
* ``split (train)``: the micro-batch split's gradient (``split``: a float64 batch of 4 in 2
  chunks, exact to 1e-12 in eval mode on every model) against the whole batch's in training
  mode, relative: round-off without BatchNorm, ``BN`` and BatchNorm's ghost-batch difference
  with it;
* ``c=0.5 / plain``: one training step (``zero_grad``, forward, cross-entropy, backward, SGD
  step) of the band-limited model at c = 0.5 over the plain model's, measured side by side:
  ``--warmup`` steps each, then ``--repeats`` rounds of one step each, alternating; the median
  of the per-round ratios (the interquartile range in the JSON).

The failures' errors follow the table; everything goes to ``benchmarks/results/zoo.json``.
Torch runs on ``--threads`` threads (default 1, as the tests).

    .venv/bin/python -m benchmarks.zoo.zoo_matrix  # every model, ~5 minutes on 2 cores
    .venv/bin/python -m benchmarks.zoo.zoo_matrix --models resnet18,timm/ --size 64
    .venv/bin/python -m benchmarks.zoo.zoo_matrix --models mobilenet --cells c05_step,bf16 --no-timing
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import statistics
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.environment import restart_with, with_path
from benchmarks.common.provenance import REPO_ROOT, RESULTS, stamp

try:  # the zoo's table and cells live in tests/ (with the helpers they import by top-level name)
    from zoo import cells as zoo_cells
    from zoo import models as zoo_models
except ModuleNotFoundError:
    restart_with(with_path(REPO_ROOT / "tests"), "benchmarks.zoo.zoo_matrix")
    raise


def _selected(filters: str | None) -> list[str]:
    names = list(zoo_models.MODELS)
    if not filters:
        return names
    wanted = [f.strip() for f in filters.split(",") if f.strip()]
    chosen = [n for n in names if any(w == n or w in n for w in wanted)]
    if not chosen:
        raise SystemExit(f"--models {filters!r} matches none of {names}")
    return chosen


def _resize(names: list[str], size: int | None) -> None:
    """Every selected model at ``size`` (at least its ``min_size``)."""
    if size is None:
        return
    for name in names:
        spec = zoo_models.MODELS[name]
        zoo_models.MODELS[name] = dataclasses.replace(spec, size=max(size, spec.min_size))


def _where(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if "lightning_bandlimit" in f.filename] or frames
    frame = ours[-1]
    path = Path(frame.filename)
    try:
        path = path.relative_to(REPO_ROOT)
    except ValueError:
        pass
    return f"{path}:{frame.lineno}"


def _run_cell(name: str, cell: str) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        result = zoo_cells.CELL_FUNCTIONS[cell](name)
        status, error = "ok", None
    except Exception as exc:  # noqa: BLE001 - a cell's failure is a result
        status = "FAIL"
        result = {}
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        error = f"{type(exc).__name__}: {first[:300]} ({_where(exc)})"
    return {"status": status, "error": error, "seconds": time.perf_counter() - start, "result": result}


def _step_ratio(name: str, warmup: int, repeats: int) -> dict[str, Any]:
    """Median over rounds of (c=0.5 step time / plain step time), side by side."""
    from lightning_bandlimit import bandlimit

    x, y = zoo_models.batch(name)
    runs = {}
    for label in ("plain", "c=0.5"):
        model = zoo_models.build(name)
        if label != "plain":
            bandlimit(model, 0.5)
        runs[label] = (model, torch.optim.SGD(model.parameters(), lr=0.01))

    def step(label: str) -> float:
        model, optimizer = runs[label]
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        loss = torch.nn.functional.cross_entropy(zoo_cells.logits(model(x)), y)
        loss.backward()
        optimizer.step()
        return time.perf_counter() - start

    for label in runs:
        for _ in range(warmup):
            step(label)
    ratios, plain_times, limited_times = [], [], []
    for r in range(repeats):
        order = ["plain", "c=0.5"] if r % 2 == 0 else ["c=0.5", "plain"]
        times = {label: step(label) for label in order}
        ratios.append(times["c=0.5"] / times["plain"])
        plain_times.append(times["plain"])
        limited_times.append(times["c=0.5"])
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {
        "ratio": statistics.median(ratios),
        "ratio_iqr": [q[0], q[2]],
        "plain_ms": 1e3 * statistics.median(plain_times),
        "c05_ms": 1e3 * statistics.median(limited_times),
    }


def _split_difference(row: dict[str, Any]) -> str:
    """The ``split`` cell's training-mode difference: ``BN`` before it with BatchNorm."""
    cell = row["cells"].get("split")
    if not cell or cell["status"] != "ok":
        return "-"
    result = cell["result"]
    difference = f"{result['train_difference']:.1e}"
    return f"BN {difference}" if result["batch_norm"] else difference


def _table(rows: list[dict[str, Any]], cells: list[str]) -> str:
    header = ["family", "model", *cells, "rungs", "split (train)", "c=0.5 / plain"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    for row in sorted(rows, key=lambda r: (r["family"], r["source"] != "torchvision", r["model"])):
        marks = [row["cells"][c]["status"] if c in row["cells"] else "-" for c in cells]
        rungs = row.get("rungs")
        timing = row.get("timing")
        ratio = f"{timing['ratio']:.2f}" if timing else "-"
        lines.append(
            "| "
            + " | ".join(
                [
                    row["family"],
                    row["model"],
                    *marks,
                    "-" if rungs is None else str(rungs),
                    _split_difference(row),
                    ratio,
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", help="comma-separated names or substrings (e.g. 'resnet,timm/'); default: all"
    )
    parser.add_argument("--size", type=int, help="input side for every model (at least its minimum)")
    parser.add_argument(
        "--cells", help=f"comma-separated cells; default: all of {', '.join(zoo_cells.CELLS)}"
    )
    parser.add_argument(
        "--all-cells", action="store_true", help="run compile and the Trainer ladder on every model"
    )
    parser.add_argument("--no-timing", action="store_true", help="skip the c=0.5 / plain step-time ratio")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per setting")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (one step per setting each)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path, default=RESULTS / "zoo.json", help="JSON output")
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore")
    for logger in ("lightning.pytorch", "lightning.fabric", "lightning_bandlimit"):
        logging.getLogger(logger).setLevel(logging.ERROR)
    torch.set_num_threads(args.threads)

    names = _selected(args.models)
    _resize(names, args.size)
    cells = list(zoo_cells.CELLS)
    if args.cells:
        unknown = sorted(set(args.cells.split(",")) - set(cells))
        if unknown:
            raise SystemExit(f"unknown cells {unknown}; expected some of {cells}")
        cells = [c for c in cells if c in args.cells.split(",")]

    rows = []
    started = time.perf_counter()
    for name in names:
        spec = zoo_models.MODELS[name]
        row: dict[str, Any] = {
            "model": name,
            "family": spec.family,
            "source": spec.source,
            "size": spec.size,
            "cells": {},
        }
        for cell in cells:
            if args.all_cells or zoo_cells.applicable(name, cell):
                row["cells"][cell] = _run_cell(name, cell)
                outcome = row["cells"][cell]
                print(
                    f"  {name:28s} {cell:18s} {outcome['status']:4s} {outcome['seconds']:6.1f}s", flush=True
                )
        rung_cell = row["cells"].get("rungs_exact_c0") or row["cells"].get("rungs_exact_c05")
        row["rungs"] = rung_cell["result"].get("rungs") if rung_cell and rung_cell["status"] == "ok" else None
        if not args.no_timing:
            try:
                row["timing"] = _step_ratio(name, args.warmup, args.repeats)
            except Exception as exc:  # noqa: BLE001
                row["timing"] = None
                row["timing_error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)

    print()
    print(
        f"Model zoo, {len(names)} models, batch 2, {args.threads} thread(s), torch {torch.__version__}; "
        "ok / FAIL / - (not run); rungs: exact checkpointing rungs at c=0; split (train): the "
        "micro-batch split's gradient (batch 4 in 2 chunks, float64) against the whole batch's in "
        "training mode, relative (BN: BatchNorm's ghost batches); c=0.5 / plain: median step-time ratio"
    )
    print()
    print(_table(rows, cells))
    failures = [
        (r["model"], c, o["error"]) for r in rows for c, o in r["cells"].items() if o["status"] != "ok"
    ]
    if failures:
        print("\nFailures:")
        for model, cell, error in failures:
            print(f"- {model} / {cell}: {error}")
    print(f"\n{time.perf_counter() - started:.0f} s")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "threads": args.threads,
        "cells": cells,
        "models": rows,
    }
    payload = {**stamp("benchmarks.zoo.zoo_matrix", argv), **payload}
    args.out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"wrote {args.out.relative_to(REPO_ROOT) if args.out.is_relative_to(REPO_ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
