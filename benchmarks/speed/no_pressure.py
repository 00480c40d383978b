"""Compression 0 at plain speed: ``AdaptiveBandLimit`` with no memory pressure against the plain model.

Issue 57, part 3. Three comparisons, each over rounds, the ratio taken per round and summarised
by its median and spread (min, max over rounds):

1. **trainer**: the quickstart model (``ImageClassifier("cifar_resnet18", width=8)``, batch 128,
   32x32 synthetic images, rendered once for all fits) in a Lightning ``Trainer`` with
   ``AdaptiveBandLimit`` (defaults; a ``ScriptedProbe`` reporting the whole device free, so nothing
   engages: compression 0, rung 0) against the same model and ``Trainer`` without the callback
   (plain ``nn.Conv2d``). A round runs the two fits side by side in threads that take turns, one
   whole loop iteration each (a drifting shared machine cancels out); a step is the wall time
   between two ``on_train_batch_end`` calls: the batch, forward, backward, optimizer step and
   every callback hook. The first ``--warmup`` steps of each fit are left out (the callback's
   first step profiles the model's stages and tries the micro-batch split).
2. **model**: the bare backbone, ``bandlimit(model)`` at compression 0 against the plain one, one
   training step (forward, cross-entropy, backward, SGD step) on the same batch, alternating
   call by call.
3. **layer**: ``BandLimitedConv2d`` at compression 0 against ``nn.Conv2d`` (forward and backward,
   training mode) on the quickstart's 8-channel 32x32 activations; and the per-call overhead on
   a tiny input (microseconds, the Python cost that a GPU would expose).

The process restarts itself with glibc's malloc held steady (``--malloc``, see
``benchmarks.common.environment.STEADY_MALLOC``).
Target (issue 57): trainer ratio at most 1.01 (printed PASS/FAIL); the model and layer ratios
are reported against the same line. Writes ``benchmarks/results/no_pressure-<device>.json``.
Run: ``python -m benchmarks.speed.no_pressure`` (about 4 minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

import lightning_bandlimit
from benchmarks.common.environment import STEADY_MALLOC, restart_with
from benchmarks.common.provenance import RESULTS, stamp
from benchmarks.common.trainer import QUIET
from lightning_bandlimit import bandlimit
from lightning_bandlimit.callbacks import AdaptiveBandLimit
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.layers import BandLimitedConv2d
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.models import ImageClassifier

TARGET = 1.01
TOTAL = 64 << 30  # the scripted device: 64 GiB, all of it free


class Baton:
    """Fits in threads take turns, one whole loop iteration each: both see the same machine, step
    by step (drifts of a shared or throttled machine cancel out of their ratio)."""

    def __init__(self, parties: int, timeout: float = 600.0) -> None:
        self._cond = threading.Condition()
        self._parties = parties
        self._turn = 0
        self._done: set[int] = set()
        self._timeout = timeout
        self.failed = False
        self.barrier = threading.Barrier(parties, timeout=timeout)

    def wait(self, me: int) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self.failed or self._turn == me, self._timeout) or self.failed:
                raise RuntimeError("another fit stopped")

    def pass_on(self, me: int, done: bool = False) -> None:
        with self._cond:
            if done:
                self._done.add(me)
            if len(self._done) < self._parties:
                turn = (me + 1) % self._parties
                while turn in self._done:
                    turn = (turn + 1) % self._parties
                self._turn = turn
            self._cond.notify_all()

    def fail(self) -> None:
        with self._cond:
            self.failed = True
            self._cond.notify_all()
        self.barrier.abort()


class Turns(pl.Callback):
    """The last callback: a step is the wall time between two ``on_train_batch_end`` calls (loop
    bookkeeping, the batch, forward, backward, optimizer step, every other callback's hooks),
    all of it while holding the baton."""

    def __init__(self, baton: Baton, me: int, device: str) -> None:
        self.baton, self.me, self.device = baton, me, device
        self.laps_ms: list[float] = []
        self._last = 0.0

    def on_train_start(self, *args: Any) -> None:
        self.baton.barrier.wait()  # both set up: no step is timed beside another fit's setup
        self.baton.wait(self.me)
        self._last = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        _sync(self.device)
        self.laps_ms.append((time.perf_counter() - self._last) * 1e3)
        if trainer.global_step < trainer.max_steps:  # the last step keeps the baton through teardown
            self.baton.pass_on(self.me)
            self.baton.wait(self.me)
            self._last = time.perf_counter()


def rendered_batches(args: argparse.Namespace) -> DataLoader:
    """The quickstart's synthetic training images, rendered once and served a batch per index
    list: data costs the same small time in every fit (rendering them per step would add its
    noise to both sides of the ratio)."""
    data = SyntheticImageDataModule(train_size=args.steps * args.batch, batch_size=args.batch)
    data.setup("fit")
    images, labels = zip(*(data.train_set[i] for i in range(len(data.train_set))))
    dataset = TensorDataset(torch.stack(images), torch.as_tensor(labels))
    sampler = BatchSampler(RandomSampler(dataset), args.batch, drop_last=True)
    return DataLoader(dataset, sampler=sampler, batch_size=None)


def fit(adaptive: bool, args: argparse.Namespace, batches: DataLoader, turns: Turns) -> None:
    """One fit of the quickstart model, with or without the callback; ``turns`` times its steps."""
    callbacks: list[pl.Callback] = [turns]
    if adaptive:
        callbacks.insert(0, AdaptiveBandLimit(probe=ScriptedProbe([TOTAL], total=TOTAL)))
    trainer = pl.Trainer(
        accelerator="gpu" if args.device == "cuda" else "cpu",
        devices=1,
        max_steps=args.steps,
        limit_val_batches=0,
        **QUIET,
        callbacks=callbacks,
    )
    torch.manual_seed(0)
    model = ImageClassifier("cifar_resnet18", width=args.width)
    try:
        trainer.fit(model, train_dataloaders=batches)
    except BaseException:
        turns.baton.fail()
        raise
    turns.baton.pass_on(turns.me, done=True)  # after its teardown: the other fit steps alone
    if adaptive:
        callback = callbacks[0]
        assert isinstance(callback, AdaptiveBandLimit)
        assert callback.compression == 0.0 and callback.rung == 0 and callback.split == 1, "it engaged"


def paired_fits(
    args: argparse.Namespace, batches: DataLoader, adaptive_first: bool
) -> dict[bool, list[float]]:
    """Step times (ms) of a plain and an adaptive fit run side by side in threads, taking turns
    step by step; the first ``--warmup`` steps of each left out."""
    baton = Baton(2)
    kinds = (True, False) if adaptive_first else (False, True)
    turns = {kind: Turns(baton, me, args.device) for me, kind in enumerate(kinds)}
    errors: list[BaseException] = []

    def run(kind: bool) -> None:
        try:
            fit(kind, args, batches, turns[kind])
        except BaseException as error:  # re-raised below, in the main thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(kind,)) for kind in kinds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return {kind: turns[kind].laps_ms[args.warmup :] for kind in kinds}


def summary(ratios: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(ratios),
        "mean": statistics.fmean(ratios),
        "min": min(ratios),
        "max": max(ratios),
        "per_round": ratios,
    }


def trainer_rounds(args: argparse.Namespace) -> dict[str, Any]:
    batches = rendered_batches(args)
    plain, adaptive, ratios = [], [], []
    for round_ in range(args.rounds):
        steps = paired_fits(args, batches, adaptive_first=round_ % 2 == 1)
        plain.append(statistics.median(steps[False]))
        adaptive.append(statistics.median(steps[True]))
        ratios.append(adaptive[-1] / plain[-1])
        print(
            f"  trainer round {round_}: plain {plain[-1]:.1f} ms, adaptive {adaptive[-1]:.1f} ms", flush=True
        )
    return {"plain_ms": plain, "adaptive_ms": adaptive, "ratio": summary(ratios)}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def interleaved(
    runs: dict[str, Callable[[], object]], rounds: int, repeats: int, device: str
) -> tuple[dict[str, list[float]], list[float]]:
    """Per round, the median time (ms) of ``repeats`` calls of each run, the runs alternating call
    by call (who goes first alternates by round); ratio second / first, per round."""
    names = list(runs)
    for run in runs.values():  # warm-up
        for _ in range(3):
            run()
    medians: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        times: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(repeats):
            for name in names if round_ % 2 == 0 else names[::-1]:
                _sync(device)
                started = time.perf_counter()
                runs[name]()
                _sync(device)
                times[name].append((time.perf_counter() - started) * 1e3)
        for name in names:
            medians[name].append(statistics.median(times[name]))
    ratios = [b / a for a, b in zip(medians[names[0]], medians[names[1]])]
    return medians, ratios


def model_rounds(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    x = torch.rand(args.batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)

    def step_of(band_limited: bool) -> Callable[[], None]:
        torch.manual_seed(0)
        model = ImageClassifier("cifar_resnet18", width=args.width).to(device).train()
        if band_limited:
            bandlimit(model, 0.0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()

        return step

    medians, ratios = interleaved(
        {"plain": step_of(False), "bandlimit": step_of(True)}, args.rounds * 2, args.repeats, args.device
    )
    return {"plain_ms": medians["plain"], "bandlimit_ms": medians["bandlimit"], "ratio": summary(ratios)}


def layer_rounds(args: argparse.Namespace, shape: tuple[int, ...], repeats: int) -> dict[str, Any]:
    device = torch.device(args.device)
    torch.manual_seed(0)
    plain = nn.Conv2d(args.width, args.width, 3, padding=1).to(device)
    layer = BandLimitedConv2d(args.width, args.width, 3, padding=1).to(device)
    layer.load_state_dict(plain.state_dict())
    x = torch.randn(*shape, device=device, requires_grad=True)

    def run(module: nn.Module) -> Callable[[], None]:
        return lambda: module(x).sum().backward()

    medians, ratios = interleaved(
        {"plain": run(plain), "bandlimited": run(layer)}, args.rounds * 2, repeats, args.device
    )
    overhead_us = 1e3 * (statistics.median(medians["bandlimited"]) - statistics.median(medians["plain"]))
    return {
        "shape": list(shape),
        "plain_ms": medians["plain"],
        "bandlimited_ms": medians["bandlimited"],
        "ratio": summary(ratios),
        "overhead_us": overhead_us,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per fit")
    parser.add_argument("--warmup", type=int, default=5, help="steps of each fit left out")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=8, help="rounds of paired fits (who starts alternates)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per setting and round")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument(
        "--malloc",
        choices=("steady", "default"),
        default="steady",
        help="steady: one glibc arena, no mmap/trim churn (restarts the process with MALLOC_* set)",
    )
    args = parser.parse_args()
    if args.malloc == "steady":
        restart_with(STEADY_MALLOC, "benchmarks.speed.no_pressure")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    output = args.output or RESULTS / f"no_pressure-{args.device}.json"

    print("layer alone (BandLimitedConv2d at c=0 vs nn.Conv2d, forward + backward)", flush=True)
    layer = layer_rounds(args, (args.batch, args.width, 32, 32), args.repeats)
    tiny = layer_rounds(args, (1, args.width, 4, 4), 200)
    print("bare model step (bandlimit(model) at c=0 vs plain)", flush=True)
    model = model_rounds(args)
    print("Trainer step (AdaptiveBandLimit, no pressure, vs no callback)", flush=True)
    trainer = trainer_rounds(args)

    verdict = "PASS" if trainer["ratio"]["median"] <= TARGET else "FAIL"
    report = {
        "trainer": trainer,
        "model": model,
        "layer": layer,
        "layer_tiny": tiny,
        "target": TARGET,
        "verdict": verdict,
        "args": {k: str(v) for k, v in vars(args).items()},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "malloc_env": {k: os.environ.get(k) for k in STEADY_MALLOC},
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "package": str(Path(lightning_bandlimit.__file__).parent),
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({**stamp("benchmarks.speed.no_pressure"), **report}, indent=2))

    def line(name: str, result: dict[str, Any], a: str, b: str) -> str:
        r = result["ratio"]
        return (
            f"{name:8s} {statistics.median(result[a]):8.2f} ms vs {statistics.median(result[b]):8.2f} ms   "
            f"ratio {r['median']:.4f} (rounds {r['min']:.4f} .. {r['max']:.4f})"
        )

    print(line("trainer", trainer, "plain_ms", "adaptive_ms"))
    print(line("model", model, "plain_ms", "bandlimit_ms"))
    print(line("layer", layer, "plain_ms", "bandlimited_ms"))
    print(
        line("tiny", tiny, "plain_ms", "bandlimited_ms") + f"   overhead {tiny['overhead_us']:+.1f} us/call"
    )
    print(f"{verdict}  trainer step ratio {trainer['ratio']['median']:.4f} <= {TARGET}")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
