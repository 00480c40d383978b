"""Overhead of ``AdaptiveBandLimit`` with default settings, as a fraction of training step time.

Three numbers, measured side by side in one run on the quickstart model (CPU):

1. **Hook time**: wall time spent inside the callback's own hooks (probe reads, the
   controller, logging, DDP agreement), divided by the median step time. Precise.
2. **Meter time**: on check steps the CPU memory model counts bytes saved for backward with a
   pack hook that runs inside the forward; its extra forward time is measured directly
   (forward with and without the meter) and amortised over ``check_every_n_steps``.
3. **End to end**: median step time with ``AdaptiveBandLimit`` vs ``BandLimit`` at the same
   compression, interleaved runs. Noisy on a shared machine; reported for completeness.

Target: (1) + (2) at most 1 % of the step time. Writes ``benchmarks/results/adaptive_overhead.json``.
Run: ``python -m benchmarks.speed.adaptive_overhead`` (about a minute on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from benchmarks.common.provenance import RESULTS, stamp
from benchmarks.common.trainer import QUIET
from lightning_bandlimit import bandlimit
from lightning_bandlimit.callbacks import AdaptiveBandLimit, BandLimit, StepTimer
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter


class TimedAdaptiveBandLimit(AdaptiveBandLimit):
    """Default AdaptiveBandLimit that records the time spent in its per-step hooks."""

    hook_seconds = 0.0

    def _timed(self, hook: Any, *args: Any) -> None:
        started = time.perf_counter()
        hook(*args)
        self.hook_seconds += time.perf_counter() - started

    def on_train_batch_start(self, *args: Any) -> None:
        self._timed(super().on_train_batch_start, *args)

    def on_before_backward(self, *args: Any) -> None:
        self._timed(super().on_before_backward, *args)

    def on_train_batch_end(self, *args: Any) -> None:
        self._timed(super().on_train_batch_end, *args)


def train(callback: BandLimit, steps: int, batch: int, width: int) -> StepTimer:
    timer = StepTimer(warmup=5)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=steps,
        limit_val_batches=0,
        **QUIET,
        callbacks=[callback, timer],
    )
    trainer.fit(
        ImageClassifier("cifar_resnet18", width=width),
        SyntheticImageDataModule(train_size=steps * batch, batch_size=batch),
    )
    return timer


def meter_seconds(batch: int, width: int, compression: float, repeats: int = 15) -> float:
    """Extra forward time of one check step's saved-tensor accounting."""
    model = bandlimit(ImageClassifier("cifar_resnet18", width=width).train(), compression)
    x = torch.rand(batch, 3, 32, 32)
    plain, metered = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        model(x)
        plain.append(time.perf_counter() - started)
        started = time.perf_counter()
        with SavedTensorMeter(exclude=model.parameters()):
            model(x)
        metered.append(time.perf_counter() - started)
    return max(0.0, min(metered) - min(plain))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--compression", type=float, default=0.5)
    parser.add_argument(
        "--rounds", type=int, default=4, help="rounds of the end-to-end comparison (order alternates)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS / "adaptive_overhead.json")
    args = parser.parse_args()

    adaptive_medians, fixed_medians, hook_fractions = [], [], []
    every = None
    for round_ in range(args.rounds):
        # Defaults, but bounded below at the run's compression: a roomy machine would otherwise
        # release it towards 0 and the two runs would compute different things.
        adaptive = TimedAdaptiveBandLimit(compression=args.compression, min_compression=args.compression)
        every = adaptive.check_every_n_steps
        order = [False, True] if round_ % 2 == 0 else [True, False]  # alternate who runs first
        runs = {
            is_adaptive: train(
                adaptive if is_adaptive else BandLimit(compression=args.compression),
                args.steps,
                args.batch,
                args.width,
            )
            for is_adaptive in order
        }
        fixed, timed = runs[False], runs[True]
        fixed_medians.append(fixed.median_ms)
        adaptive_medians.append(timed.median_ms)
        hook_fractions.append(adaptive.hook_seconds * 1e3 / len(timed.durations_ms) / timed.median_ms)

    step_ms = statistics.median(fixed_medians)
    meter_ms = meter_seconds(args.batch, args.width, args.compression) * 1e3
    hooks = statistics.median(hook_fractions)
    meter = meter_ms / every / step_ms
    end_to_end = statistics.median(adaptive_medians) / step_ms - 1
    verdict = "PASS" if hooks + meter <= 0.01 else "MISS"
    report = {
        "step_ms_fixed": fixed_medians,
        "step_ms_adaptive": adaptive_medians,
        "hook_fraction": hooks,
        "meter_ms_per_check": meter_ms,
        "check_every_n_steps": every,
        "meter_fraction": meter,
        "overhead_fraction": hooks + meter,
        "end_to_end_fraction": end_to_end,
        "target": 0.01,
        "verdict": verdict,
        "args": {k: str(v) for k, v in vars(args).items()},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({**stamp("benchmarks.speed.adaptive_overhead"), **report}, indent=2))
    print(
        f"median step {step_ms:.1f} ms (BandLimit) vs {statistics.median(adaptive_medians):.1f} ms "
        "(AdaptiveBandLimit)"
    )
    print(f"hook time            {hooks * 100:6.3f} % of a step")
    print(f"meter (every {every:>2} st.) {meter * 100:6.3f} % of a step ({meter_ms:.2f} ms per check)")
    print(
        f"{verdict}  overhead {100 * (hooks + meter):.3f} % <= 1 %   (end to end, noisy: "
        f"{100 * end_to_end:+.1f} %)"
    )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
