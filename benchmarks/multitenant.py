"""Two jobs sharing one memory budget, with and without ``AdaptiveBandLimit``.

Job A is a real training run (the quickstart model on synthetic data, CPU). Its memory at a
compression is measured, not assumed: bytes saved for backward by the real model at batch size
``--batch`` for compressions 0..0.9, plus parameters, gradients and momentum. Job B is a
co-tenant whose memory follows a scripted trace: it rises mid-run, holds, and leaves. The shared
budget is set so that both fit only if job A compresses. The probe job A reads reports
``budget - A(current compression) - B(step)``, what NVML would report on a shared GPU.

Without the callback (job A band-limited at a fixed compression) the co-tenant's request
exceeds the budget at its peak: it would fail (or job A would). With the callback, job A raises
its compression before the peak and gives it back after. Prints the outcome and writes
``benchmarks/results/multitenant.json`` and ``multitenant.png`` (compression and memory timelines).

Run: ``python benchmarks/multitenant.py`` (about a minute on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch

from lightning_bandlimit import bandlimit, set_compression
from lightning_bandlimit.callbacks import AdaptiveBandLimit, BandLimit
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.saved_tensors import saved_activation_bytes

MIB = 2**20


def job_a_memory_curve(batch: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Measured bytes of job A at compressions 0, 0.1, ..., 0.9 (activations + 3x parameters)."""
    model = ImageClassifier("cifar_resnet18", width=width).train()
    bandlimit(model, 0.0)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    x = torch.rand(batch, 3, 32, 32)
    grid = np.round(np.arange(0.0, 0.91, 0.1), 2)
    memory = []
    for c in grid:
        set_compression(model, float(c))
        memory.append(saved_activation_bytes(model, x) + 3 * params)
    return grid, np.array(memory, dtype=np.float64)


def cotenant_trace(steps: int, low: float, high: float) -> np.ndarray:
    """Co-tenant bytes per step: low, ramp up over 20 % of the run from 25 %, hold, leave at 70 %."""
    t = np.arange(steps) / steps
    ramp = np.clip((t - 0.25) / 0.2, 0, 1) * (t < 0.7)
    return low + (high - low) * ramp


class SharedDevice:
    """The budget both jobs draw on; records every step for the report."""

    def __init__(self, budget: float, curve: tuple[np.ndarray, np.ndarray], cotenant: np.ndarray) -> None:
        self.budget, self.curve, self.cotenant = budget, curve, cotenant
        self.compression = 0.0
        self.log: list[dict[str, float]] = []

    def job_a(self, compression: float) -> float:
        return float(np.interp(compression, *self.curve))

    def free(self, step: int) -> int:
        b = float(self.cotenant[min(step, len(self.cotenant) - 1)])
        a = self.job_a(self.compression)
        self.log.append({"step": step, "compression": self.compression, "job_a": a, "job_b": b,
                         "free": self.budget - a - b})
        return int(max(0.0, self.budget - a - b))


class Follow(pl.Callback):
    """Tells the shared device which compression job A runs with, and reads its probe every step."""

    def __init__(self, device: SharedDevice, band: BandLimit, probe: ScriptedProbe | None) -> None:
        self.device, self.band, self.probe = device, band, probe

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        self.device.compression = self.band.compression
        if self.probe is None:  # no callback reads the probe: record the step ourselves
            self.device.free(trainer.global_step)


def run(adaptive: bool, device: SharedDevice, steps: int, batch: int, width: int, start: float, seed: int) -> dict:
    pl.seed_everything(seed, verbose=False)
    device.compression, device.log = start, []
    probe = ScriptedProbe(free=device.free, total=int(device.budget))
    if adaptive:
        band: BandLimit = AdaptiveBandLimit(
            compression=start, min_compression=start, max_compression=0.9, min_free=0.1,
            release_free=0.25, check_every_n_steps=1, probe=probe, raise_step=0.2, lower_step=0.1,
        )
    else:
        band = BandLimit(compression=start)
    data = SyntheticImageDataModule(train_size=steps * batch // 2, val_size=1000, batch_size=batch, seed=seed)
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=[band, Follow(device, band, probe if adaptive else None)],
    )
    model = ImageClassifier("cifar_resnet18", width=width)
    started = time.perf_counter()
    trainer.fit(model, data)
    accuracy = trainer.validate(model, data, verbose=False)[0]["val/acc"]
    over = [r for r in device.log if r["free"] < 0]
    return {
        "adaptive": adaptive,
        "timeline": device.log,
        "exceeded_budget_steps": [r["step"] for r in over],
        "min_free_mib": min((r["free"] for r in device.log), default=0.0) / MIB,
        "both_fit": not over,
        "final_val_accuracy": accuracy,
        "max_compression": max(r["compression"] for r in device.log),
        "final_compression": device.log[-1]["compression"],
        "wall_s": time.perf_counter() - started,
    }


def plot(results: list[dict], budget: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for result in results:
        label = "with AdaptiveBandLimit" if result["adaptive"] else "without (fixed compression)"
        steps = [r["step"] for r in result["timeline"]]
        axes[0].plot(steps, [r["compression"] for r in result["timeline"]], label=label)
        total = [(r["job_a"] + r["job_b"]) / MIB for r in result["timeline"]]
        axes[1].plot(steps, total, label=f"A + B, {label}")
    axes[1].plot(steps, [r["job_b"] / MIB for r in results[0]["timeline"]], "k:", label="co-tenant B")
    axes[1].axhline(budget / MIB, color="r", linestyle="--", label="budget")
    axes[0].set_ylabel("job A compression")
    axes[1].set_ylabel("MiB")
    axes[1].set_xlabel("training step")
    axes[0].legend()
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--start", type=float, default=0.0, help="job A's compression before the co-tenant grows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    curve = job_a_memory_curve(args.batch, args.width)
    a_full, a_min = curve[1][0], curve[1][-1]
    b_low, b_high = 0.2 * a_full, 1.0 * a_full
    # Both fit at the co-tenant's peak only if job A saves at least 70 % of what it can.
    budget = a_full + b_high - 0.7 * (a_full - a_min) + 0.06 * (a_full + b_high)
    device = SharedDevice(budget, curve, cotenant_trace(args.steps, b_low, b_high))
    results = [run(adaptive, device, args.steps, args.batch, args.width, args.start, args.seed) for adaptive in (False, True)]

    args.output.mkdir(parents=True, exist_ok=True)
    report = {
        "job_a_memory_mib": {f"{c:.1f}": m / MIB for c, m in zip(*curve)},
        "budget_mib": budget / MIB,
        "cotenant_mib": {"low": b_low / MIB, "high": b_high / MIB},
        "args": {k: str(v) for k, v in vars(args).items()},
        "results": results,
    }
    (args.output / "multitenant.json").write_text(json.dumps(report, indent=2))
    plot(results, budget, args.output / "multitenant.png")
    print("job A memory (MiB) by compression: " + ", ".join(f"{c:.1f}:{m / MIB:.0f}" for c, m in zip(*curve)))
    print(f"budget {budget / MIB:.0f} MiB; co-tenant {b_low / MIB:.0f} -> {b_high / MIB:.0f} MiB and back")
    print(f"{'run':<32} {'both fit':>8} {'steps over':>10} {'min free MiB':>12} {'max c':>6} {'final c':>7} {'val acc':>7}")
    for r in results:
        name = "with AdaptiveBandLimit" if r["adaptive"] else f"without (fixed c={args.start})"
        print(f"{name:<32} {str(r['both_fit']):>8} {len(r['exceeded_budget_steps']):>10} "
              f"{r['min_free_mib']:>12.1f} {r['max_compression']:>6.2f} {r['final_compression']:>7.2f} "
              f"{r['final_val_accuracy']:>7.3f}")
    print(f"wrote {args.output / 'multitenant.json'} and {args.output / 'multitenant.png'}")


if __name__ == "__main__":
    main()
