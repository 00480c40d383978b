"""Benchmark ``BandLimitedConv2d`` against ``nn.Conv2d`` on the ResNet-18-for-CIFAR conv shapes.

What it measures, per layer shape and per compression ``c`` (default ``0 0.25 0.5 0.75``), with
``nn.Conv2d`` as the reference, all candidates measured side by side in one run:

* **Time**: forward + ``output.backward(grad)`` with a fixed, precomputed ``grad``, in
  milliseconds. After ``--warmup`` untimed iterations, ``--repeats`` rounds are timed with
  ``time.perf_counter``; within each round every candidate (reference and each ``c``) runs once,
  interleaved (the order rotates each round) so machine noise hits all of them alike. The
  reported figure is the median over rounds. Gradients are reset to ``None`` outside the timed
  region. On CUDA the device is synchronised around each timing and TF32 is disabled.
* **Bytes saved for backward**: one forward under ``torch.autograd.graph.saved_tensors_hooks``;
  the storages of all packed tensors are de-duplicated by ``untyped_storage().data_ptr()`` and
  their ``nbytes`` summed, excluding the layer's parameter storages (the weight). Tensors an
  autograd function keeps as plain ``ctx`` attributes are invisible to the hooks.
* **Achieved compression**: the layer's ``achieved_compression`` after a forward, i.e.
  ``spectral_band((H + 2p, W + 2p), c).compression``, the quantised rate actually applied on the
  padded-input grid (computed with ``spectral_band`` if the layer does not expose it).

Layers (batch 32, 3x3 kernels, padding 1, ``bias=False`` as in ResNet): stride 1 ``3->64 @32``,
``64->64 @32``, ``128->128 @16``, ``256->256 @8``, ``512->512 @4``; stride 2 ``64->128 @32``,
``128->256 @16``, ``256->512 @8``. The stem's input does not require grad (images); every other
input does (as inside a network). Weights are parameters.

Targets (benchmark goals, not tests), evaluated per layer and on the TOTAL (sum over layers):
time at ``c=0`` at most 2x ``nn.Conv2d``; time at ``c=0.5`` no slower than ``nn.Conv2d``
(ratio <= 1.0); bytes saved for backward non-increasing in ``c``.

Output: aligned plain-text tables and PASS/MISS lines on stdout (a short progress line per layer
on stderr) and a JSON file, by default ``benchmarks/results/conv-<device>.json``
(``conv-<device>-quick.json`` with ``--quick``).

Run from the repository root::

    .venv/bin/python -m benchmarks.speed.conv          # full CPU run
    .venv/bin/python -m benchmarks.speed.conv --quick  # smoke run, seconds
    .venv/bin/python -m benchmarks.speed.conv --device cuda
    .venv/bin/python -m benchmarks.speed.conv --threads 2 --repeats 11 --compressions 0 0.5
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.common.provenance import RESULTS, command, device_name, git_commit, git_dirty
from lightning_bandlimit import BandLimitedConv2d
from lightning_bandlimit.functional import spectral_band
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter

REFERENCE = "nn.Conv2d"
TIME_RATIO_AT_C0 = 2.0
TIME_RATIO_AT_C05 = 1.0
CONTENTION_WARNING = 0.10  # share of the CPUs used by other processes above which timings are flagged


@dataclass(frozen=True)
class LayerSpec:
    """One convolution shape of ResNet-18 for CIFAR (3x3 kernel, padding 1, no bias)."""

    in_channels: int
    out_channels: int
    size: int
    stride: int
    kernel: int = 3
    padding: int = 1

    @property
    def name(self) -> str:
        """Short label, e.g. ``64->128 32x32 s2``."""
        return f"{self.in_channels}->{self.out_channels} {self.size}x{self.size} s{self.stride}"

    @property
    def grid(self) -> tuple[int, int]:
        """FFT grid: the padded input's spatial size."""
        side = self.size + 2 * self.padding
        return (side, side)

    @property
    def is_stem(self) -> bool:
        """The first layer, whose input is the image batch (no grad)."""
        return self.in_channels == 3


LAYERS: tuple[LayerSpec, ...] = (
    LayerSpec(3, 64, 32, 1),
    LayerSpec(64, 64, 32, 1),
    LayerSpec(128, 128, 16, 1),
    LayerSpec(256, 256, 8, 1),
    LayerSpec(512, 512, 4, 1),
    LayerSpec(64, 128, 32, 2),
    LayerSpec(128, 256, 16, 2),
    LayerSpec(256, 512, 8, 2),
)


@dataclass
class Candidate:
    """A module under test on one layer shape: the reference (``c is None``) or one compression."""

    label: str
    compression: float | None
    module: nn.Module
    times_ms: list[float]
    saved_bytes: int = 0
    achieved: float | None = None
    max_rel_err: float | None = None


def c_label(c: float) -> str:
    """Column label of a compression, e.g. ``c=0.25``."""
    return f"c={c:g}"


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_candidates(spec: LayerSpec, compressions: list[float], device: torch.device) -> list[Candidate]:
    """The reference ``nn.Conv2d`` and one ``BandLimitedConv2d`` per compression, same weight."""
    common: dict[str, Any] = dict(
        kernel_size=spec.kernel, stride=spec.stride, padding=spec.padding, bias=False
    )
    reference = nn.Conv2d(spec.in_channels, spec.out_channels, **common).to(device)
    candidates = [Candidate(REFERENCE, None, reference, [])]
    for c in compressions:
        # memory_lean=False, algorithm="spectral": the frequency-domain kernel itself at every c
        # (the default dispatches a full band to the native convolution and picks the cheaper
        # algorithm per shape); whole-model figures are model_memory.py's and model_speed.py's.
        layer = BandLimitedConv2d(
            spec.in_channels, spec.out_channels, compression=c, memory_lean=False, **common
        ).to(device)
        layer.algorithm = "spectral"
        with torch.no_grad():
            layer.weight.copy_(reference.weight)
        achieved = spectral_band(spec.grid, c).compression
        candidates.append(Candidate(c_label(c), c, layer, [], achieved=achieved))
    return candidates


def clear_grads(module: nn.Module, x: torch.Tensor) -> None:
    """Drop accumulated gradients so every timed backward starts from ``None``."""
    x.grad = None
    for p in module.parameters():
        p.grad = None


def step(module: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> None:
    """One forward + backward."""
    module(x).backward(grad)


def time_step(module: nn.Module, x: torch.Tensor, grad: torch.Tensor, device: torch.device) -> float:
    """Milliseconds of one forward + backward, gradients cleared beforehand (untimed)."""
    clear_grads(module, x)
    synchronize(device)
    start = time.perf_counter()
    step(module, x, grad)
    synchronize(device)
    return (time.perf_counter() - start) * 1e3


def saved_tensor_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the unique storages autograd saves for backward in one forward, parameters excluded."""
    with SavedTensorMeter(exclude=module.parameters()) as meter:
        out = module(x)
    del out
    return meter.bytes


def compare_outputs(candidates: list[Candidate], x: torch.Tensor) -> None:
    """Relative max error of each candidate's output against the reference (sanity check)."""
    with torch.no_grad():
        ref = candidates[0].module(x)
        scale = ref.abs().max().item() or 1.0
        for cand in candidates[1:]:
            cand.max_rel_err = (cand.module(x) - ref).abs().max().item() / scale
            achieved = getattr(cand.module, "achieved_compression", None)  # set by the layer's forward
            if achieved is not None:
                cand.achieved = float(achieved)


def run_layer(
    spec: LayerSpec, compressions: list[float], batch: int, warmup: int, repeats: int, device: torch.device
) -> list[Candidate]:
    """Measure every candidate on one layer shape (timings interleaved per round)."""
    candidates = build_candidates(spec, compressions, device)
    x = torch.randn(batch, spec.in_channels, spec.size, spec.size, device=device)
    x.requires_grad_(not spec.is_stem)
    with torch.no_grad():
        grad = torch.randn_like(candidates[0].module(x))

    compare_outputs(candidates, x)
    for cand in candidates:
        cand.saved_bytes = saved_tensor_bytes(cand.module, x)
    for _ in range(warmup):
        for cand in candidates:
            time_step(cand.module, x, grad, device)
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(repeats):
            shift = r % len(candidates)
            for cand in candidates[shift:] + candidates[:shift]:
                cand.times_ms.append(time_step(cand.module, x, grad, device))
    finally:
        if gc_was_enabled:
            gc.enable()
    return candidates


def median(values: list[float]) -> float:
    """Median of a non-empty list."""
    return float(statistics.median(values))


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """Plain-text table: first column left-aligned, the rest right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        parts = [cells[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(cells[1:], widths[1:])]
        return "  ".join(parts).rstrip()

    rule = "-" * len(line(header))
    return (
        "\n".join([line(header), rule, *(line(r) for r in rows[:-1]), rule, line(rows[-1])])
        if rows
        else line(header)
    )


def mib(n: int) -> str:
    """Bytes as MiB with two decimals."""
    return f"{n / 2**20:.2f}"


def evaluate_targets(results: dict[str, list[Candidate]], compressions: list[float]) -> list[dict[str, Any]]:
    """PASS/MISS verdicts of the benchmark targets, per layer and on the total."""
    verdicts: list[dict[str, Any]] = []
    scopes = list(results) + ["TOTAL"]

    def time_of(scope: str, label: str) -> float:
        layers = results.values() if scope == "TOTAL" else [results[scope]]
        return sum(median(next(c for c in cands if c.label == label).times_ms) for cands in layers)

    def bytes_of(scope: str, label: str) -> int:
        layers = results.values() if scope == "TOTAL" else [results[scope]]
        return sum(next(c for c in cands if c.label == label).saved_bytes for cands in layers)

    for c, limit, name in (
        (0.0, TIME_RATIO_AT_C0, "time at c=0 <= 2.0x nn.Conv2d"),
        (0.5, TIME_RATIO_AT_C05, "time at c=0.5 <= 1.0x nn.Conv2d"),
    ):
        if c not in compressions:
            verdicts.append(
                {"target": name, "scope": "ALL", "verdict": "SKIP", "detail": f"{c_label(c)} not measured"}
            )
            continue
        for scope in scopes:
            ratio = time_of(scope, c_label(c)) / time_of(scope, REFERENCE)
            verdicts.append(
                {
                    "target": name,
                    "scope": scope,
                    "value": ratio,
                    "threshold": limit,
                    "verdict": "PASS" if ratio <= limit else "MISS",
                    "detail": f"{ratio:.2f}x",
                }
            )

    name = "bytes saved for backward non-increasing in c"
    order = sorted(compressions)
    if len(order) < 2:
        verdicts.append(
            {"target": name, "scope": "ALL", "verdict": "SKIP", "detail": "fewer than two compressions"}
        )
    else:
        for scope in scopes:
            values = [bytes_of(scope, c_label(c)) for c in order]
            ok = all(b <= a for a, b in zip(values, values[1:]))
            strict = all(b < a for a, b in zip(values, values[1:]))
            detail = (
                " >= ".join(mib(v) for v in values) + " MiB" + ("" if not ok or strict else " (some equal)")
            )
            verdicts.append(
                {
                    "target": name,
                    "scope": scope,
                    "value": values,
                    "strict": strict,
                    "verdict": "PASS" if ok else "MISS",
                    "detail": detail,
                }
            )
    return verdicts


def report(
    results: dict[str, list[Candidate]], compressions: list[float], repeats: int
) -> tuple[str, dict[str, Any]]:
    """Printable tables and the totals record."""
    labels = [REFERENCE] + [c_label(c) for c in compressions]
    total_ms = {lab: 0.0 for lab in labels}
    total_bytes = {lab: 0 for lab in labels}
    time_rows: list[list[str]] = []
    byte_rows: list[list[str]] = []
    comp_rows: list[list[str]] = []
    for layer, cands in results.items():
        ref_ms, ref_bytes = median(cands[0].times_ms), cands[0].saved_bytes
        t_row, b_row, c_row = [layer], [layer], [layer]
        for cand in cands:
            ms = median(cand.times_ms)
            total_ms[cand.label] += ms
            total_bytes[cand.label] += cand.saved_bytes
            if cand.compression is None:
                t_row.append(f"{ms:.2f}")
                b_row.append(mib(cand.saved_bytes))
            else:
                t_row.append(f"{ms:.2f} ({ms / ref_ms:.2f}x)")
                b_row.append(f"{mib(cand.saved_bytes)} ({cand.saved_bytes / ref_bytes:.2f}x)")
                c_row.append(f"{cand.achieved:.3f}")
        time_rows.append(t_row)
        byte_rows.append(b_row)
        comp_rows.append(c_row)
    ref_total_ms, ref_total_bytes = total_ms[REFERENCE], total_bytes[REFERENCE]
    time_rows.append(
        ["TOTAL", f"{ref_total_ms:.2f}"]
        + [f"{total_ms[lab]:.2f} ({total_ms[lab] / ref_total_ms:.2f}x)" for lab in labels[1:]]
    )
    byte_rows.append(
        ["TOTAL", mib(ref_total_bytes)]
        + [f"{mib(total_bytes[lab])} ({total_bytes[lab] / ref_total_bytes:.2f}x)" for lab in labels[1:]]
    )
    comp_rows.append(["(requested)"] + [f"{c:.3f}" for c in compressions])

    text = "\n\n".join(
        [
            f"Forward+backward time, ms (median of {repeats}; ratio to {REFERENCE})\n"
            + format_table(["layer", *labels], time_rows),
            f"Bytes saved for backward, MiB (parameters excluded; ratio to {REFERENCE})\n"
            + format_table(["layer", *labels], byte_rows),
            "Achieved compression (padded-input grid)\n" + format_table(["layer", *labels[1:]], comp_rows),
        ]
    )
    totals = {
        lab: {
            "ms": total_ms[lab],
            "ratio": total_ms[lab] / ref_total_ms,
            "bytes": total_bytes[lab],
            "bytes_ratio": total_bytes[lab] / ref_total_bytes,
        }
        for lab in labels
    }
    return text, totals


def records(
    results: dict[str, list[Candidate]], specs: dict[str, LayerSpec], batch: int
) -> list[dict[str, Any]]:
    """Per-layer, per-candidate JSON records."""
    out: list[dict[str, Any]] = []
    for layer, cands in results.items():
        spec = specs[layer]
        ref_ms, ref_bytes = median(cands[0].times_ms), cands[0].saved_bytes
        shape = {
            "batch": batch,
            "in_channels": spec.in_channels,
            "out_channels": spec.out_channels,
            "height": spec.size,
            "width": spec.size,
            "kernel": spec.kernel,
            "stride": spec.stride,
            "padding": spec.padding,
            "input_requires_grad": not spec.is_stem,
        }
        for cand in cands:
            ms = median(cand.times_ms)
            out.append(
                {
                    "layer": layer,
                    "shape": shape,
                    "module": REFERENCE if cand.compression is None else "BandLimitedConv2d",
                    "c": cand.compression,
                    "achieved_c": cand.achieved,
                    "ms": ms,
                    "ms_samples": cand.times_ms,
                    "ratio": ms / ref_ms,
                    "bytes": cand.saved_bytes,
                    "bytes_ratio": cand.saved_bytes / ref_bytes,
                    "max_rel_err_vs_reference": cand.max_rel_err,
                }
            )
    return out


def system_cpu_seconds() -> float | None:
    """Busy CPU seconds of the whole machine so far (all cores, from ``/proc/stat``), or ``None``."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError, IndexError):
        return None
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds used by this process (all threads)."""
    t = os.times()
    return t.user + t.system


class Contention:
    """Fraction of the machine's CPU capacity used by *other* processes over an interval."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.system = system_cpu_seconds()
        self.own = own_cpu_seconds()

    def other_busy_fraction(self) -> float | None:
        """``(machine busy - own busy) / (wall * cores)`` since construction, or ``None``."""
        system = system_cpu_seconds()
        if system is None or self.system is None:
            return None
        wall = time.perf_counter() - self.wall
        other = (system - self.system) - (own_cpu_seconds() - self.own)
        return max(0.0, other / (wall * (os.cpu_count() or 1))) if wall > 0 else None


def probe_contention(seconds: float = 0.5) -> float | None:
    """Other processes' share of the CPUs over a short idle probe."""
    probe = Contention()
    time.sleep(seconds)
    return probe.other_busy_fraction()


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default: cpu")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default 7; 3 with --quick)")
    p.add_argument(
        "--warmup", type=int, default=None, help="untimed rounds first (default 2; 1 with --quick)"
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: all available cores)"
    )
    p.add_argument("--batch", type=int, default=None, help="batch size (default 32; 2 with --quick)")
    p.add_argument(
        "--compressions",
        type=float,
        nargs="+",
        default=[0.0, 0.25, 0.5, 0.75],
        help="compressions to compare (default: 0 0.25 0.5 0.75)",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help="JSON path (default benchmarks/results/conv-<device>[-quick].json)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: batch 2, 3 repeats, 1 warm-up")
    args = p.parse_args(argv)
    args.repeats = args.repeats if args.repeats is not None else (3 if args.quick else 7)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.batch = args.batch if args.batch is not None else (2 if args.quick else 32)
    args.threads = args.threads if args.threads is not None else available_cores()
    if args.repeats < 1 or args.warmup < 0 or args.batch < 1 or args.threads < 1:
        p.error("--repeats, --batch and --threads must be >= 1 and --warmup >= 0")
    if any(not 0.0 <= c < 1.0 for c in args.compressions):
        p.error("--compressions must lie in [0, 1)")
    args.compressions = sorted(set(args.compressions))
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda requested but torch.cuda.is_available() is False")
    if args.output is None:
        suffix = "-quick" if args.quick else ""
        args.output = RESULTS / f"conv-{args.device}{suffix}.json"
    return args


def configure(device: torch.device, threads: int) -> None:
    """Thread count, and full-precision float32 matmuls/convolutions on CUDA."""
    torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the tables and verdicts, write the JSON."""
    args = parse_args(argv)
    device = torch.device(args.device)
    configure(device, args.threads)
    torch.manual_seed(0)

    print(
        f"torch {torch.__version__} | {args.device}: {device_name(device)} | threads "
        f"{torch.get_num_threads()} | "
        f"batch {args.batch} | warm-up {args.warmup} | repeats {args.repeats} | "
        f"c in {' '.join(f'{c:g}' for c in args.compressions)}",
        flush=True,
    )
    busy_before = probe_contention()
    contention = Contention()
    specs = {spec.name: spec for spec in LAYERS}
    results: dict[str, list[Candidate]] = {}
    started = time.perf_counter()
    for i, spec in enumerate(LAYERS, 1):
        t0 = time.perf_counter()
        results[spec.name] = run_layer(spec, args.compressions, args.batch, args.warmup, args.repeats, device)
        print(
            f"[{i}/{len(LAYERS)}] {spec.name}: {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True
        )
    elapsed = time.perf_counter() - started
    busy_during = contention.other_busy_fraction()

    text, totals = report(results, args.compressions, args.repeats)
    verdicts = evaluate_targets(results, args.compressions)
    print()
    print(text)
    print("\nTargets (benchmark goals, not tests)")
    scope_width = max(len(v["scope"]) for v in verdicts)
    for v in verdicts:
        print(f"{v['verdict']:<4}  {v['target']:<46}  {v['scope']:<{scope_width}}  {v['detail']}")
    busy = [b for b in (busy_before, busy_during) if b is not None]
    if busy and max(busy) > CONTENTION_WARNING:
        shown = ", ".join(
            f"{name}: {'n/a' if b is None else format(b, '.0%')}"
            for name, b in (("before", busy_before), ("during the run", busy_during))
        )
        print(
            f"\nWARNING: other processes used up to {max(busy):.0%} of the CPUs ({shown}); "
            "CPU timings are skewed."
        )
    worst = [
        c
        for cands in results.values()
        for c in cands[1:]
        if c.compression == 0.0 and c.max_rel_err is not None
    ]
    if worst:
        print(
            f"\nSanity: max relative output error at c=0 vs {REFERENCE}: "
            f"{max(c.max_rel_err for c in worst):.2e}"
        )

    payload: dict[str, Any] = {
        "benchmark": "conv",
        "command": command("benchmarks.speed.conv", sys.argv[1:] if argv is None else argv),
        "records": records(results, specs, args.batch),
        "totals": totals,
        "targets": verdicts,
        "metadata": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "device": args.device,
            "device_name": device_name(device),
            "threads": torch.get_num_threads(),
            "available_cores": available_cores(),
            "batch": args.batch,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "quick": args.quick,
            "compressions": args.compressions,
            "dtype": "float32",
            "tf32": False if device.type == "cuda" else None,
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git_commit(),
            "git_dirty": git_dirty(),
            "elapsed_s": elapsed,
            "other_cpu_busy_before": busy_before,
            "other_cpu_busy_during": busy_during,
            "timing": "median over repeats of perf_counter(forward + backward(grad)), candidates interleaved "
            "per round",
            "bytes": "unique storages packed by saved_tensors_hooks in one forward, parameter storages "
            "excluded",
        },
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nWrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
