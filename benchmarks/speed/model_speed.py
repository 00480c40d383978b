"""Whole-model training speed, band-limited (memory-lean, the default) against the plain ``nn.Conv2d`` model.

For each model, one training step (``zero_grad(set_to_none=True)``, forward, cross-entropy,
backward, SGD-with-momentum step) is timed for ``plain`` (the model as the user has it) and for
each compression ``c`` (band-limited with the library's defaults: memory-lean training and the
per-layer algorithm choice), through two paths:

* ``bare``: ``bandlimit(model, c)`` on the bare backbone, a hand-written step. All settings live
  in one process and are timed side by side: after ``--warmup`` steps each, ``--repeats`` rounds
  in which every setting runs one step, the order rotating each round. The headline ratio is the
  median over rounds of (setting's step time / plain's step time in the same round), which
  cancels the machine's slow drifts; the spread is the interquartile range of those ratios.
* ``trainer``: what users run, ``ImageClassifier`` in a ``Trainer`` with the ``BandLimit``
  callback (none for ``plain``); a callback times ``on_train_batch_start`` to
  ``on_train_batch_end``. A ``fit`` cannot be interleaved step by step, so each setting runs
  two fresh ``fit`` s (settings in order, then in reverse order), ``--warmup`` untimed steps
  each; the ratio is of the medians of all timed steps.

``--checkpoint`` (bare path only): every residual block of every setting, plain included, is
checkpointed (``checkpoint`` on each of ``checkpoint_units``): the ratios are then to the
checkpointed plain model, what a user would otherwise run under memory pressure; the targets
are issue 24's (at most 1.1 at c = 0.5, below 1.0 at c = 0.75; JSON ``-checkpointed``).

CPU: ``torch.set_num_threads(--threads)``. CUDA: synchronised around each timing, cuDNN benchmark
mode on, ``--tf32 off|on|both``.

Targets (issue 11), ratio to plain: CIFAR ResNet-18 (width 64, batch 32) <= 1.03 / 0.80 / 0.55
and torchvision ``resnet18`` (224x224, batch 8) <= 1.03 / 1.00 / 0.75 at c = 0 / 0.5 / 0.75.
Printed as PASS/MISS; JSON to ``benchmarks/results/model_speed-<device>.json`` (``-quick``
with ``--quick``). The machines are shared and noisy: read the spread beside each ratio.

    .venv/bin/python -m benchmarks.speed.model_speed          # about 10 minutes on 2 cores
    .venv/bin/python -m benchmarks.speed.model_speed --quick  # small models, a minute
    .venv/bin/python -m benchmarks.speed.model_speed --device cuda --tf32 both
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.provenance import RESULTS, device_name, write_result
from benchmarks.common.trainer import QUIET

TARGETS = {
    "cifar_resnet18": {0.0: 1.03, 0.5: 0.80, 0.75: 0.55},
    "resnet18": {0.0: 1.03, 0.5: 1.00, 0.75: 0.75},
}
#: issue 24, every block checkpointed, ratio to the checkpointed plain model (0.75: strictly below)
CHECKPOINTED_TARGETS = {0.5: 1.10, 0.75: 0.999}
MODELS = {
    "cifar_resnet18": dict(backbone="cifar_resnet18", width=64, batch=32, size=32),
    "resnet18": dict(backbone="resnet18", width=None, batch=8, size=224),  # torchvision
}
QUICK_MODELS = {
    "cifar_resnet18": dict(backbone="cifar_resnet18", width=16, batch=8, size=32),
    "resnet18": dict(backbone="resnet18", width=None, batch=2, size=96),
}


class _Clock:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def _label(c: float | None) -> str:
    return "plain" if c is None else f"c={c:g}"


def _swapped(model: torch.nn.Module) -> dict[str, int]:
    from lightning_bandlimit.layers.band_limited import BandLimitedConvNd
    from lightning_bandlimit.layers.lean import LeanModule

    kinds = (LeanModule, BandLimitedConvNd)
    return dict(sorted(Counter(type(m).__name__ for m in model.modules() if isinstance(m, kinds)).items()))


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def _bare(
    cfg: dict[str, Any], settings: list[float | None], args: argparse.Namespace
) -> dict[Any, dict[str, Any]]:
    from lightning_bandlimit import bandlimit
    from lightning_bandlimit.models.backbones import build_backbone
    from lightning_bandlimit.recompute.switch import checkpoint
    from lightning_bandlimit.recompute.unit_choice import checkpoint_units

    device, clock = torch.device(args.device), _Clock(torch.device(args.device))
    x = torch.rand(cfg["batch"], 3, cfg["size"], cfg["size"], device=device)
    y = torch.arange(cfg["batch"], device=device) % 10
    runs = {}
    for c in settings:
        torch.manual_seed(0)
        model = build_backbone(cfg["backbone"], 10, cfg["width"]).to(device)
        if c is not None:
            bandlimit(model, c)
        if args.checkpoint:
            for _, unit in checkpoint_units(model):
                checkpoint(unit)
        model.train()
        runs[c] = (model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))

    def step(c: float | None) -> float:
        model, optimizer = runs[c]
        start = clock.now()
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        return clock.now() - start

    for c in settings:
        for _ in range(args.warmup):
            step(c)
    times: dict[Any, list[float]] = {c: [] for c in settings}
    for r in range(args.repeats):
        order = settings[r % len(settings) :] + settings[: r % len(settings)]
        for c in order:
            times[c].append(step(c))
    out = {}
    for c in settings:
        paired = [t / p for t, p in zip(times[c], times[None])]
        out[c] = dict(
            step_ms=[1000 * t for t in times[c]],
            median_ms=1000 * statistics.median(times[c]),
            ratio=statistics.median(paired),
            spread=_quartiles(paired),
            swapped=_swapped(runs[c][0]),
        )
    return out


def _trainer(
    cfg: dict[str, Any], settings: list[float | None], args: argparse.Namespace
) -> dict[Any, dict[str, Any]]:
    import lightning.pytorch as pl
    from torch.utils.data import TensorDataset

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # one fit per setting and pass

    from lightning_bandlimit.callbacks import BandLimit
    from lightning_bandlimit.models import ImageClassifier

    clock = _Clock(torch.device(args.device))
    per_pass = args.warmup + -(-args.repeats // 2)
    images = torch.rand(per_pass * cfg["batch"], 3, cfg["size"], cfg["size"])
    labels = torch.arange(len(images)) % 10

    class StepTimer(pl.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_batch_start(self, *_: Any) -> None:
            self.start = clock.now()

        def on_train_batch_end(self, *_: Any) -> None:
            self.times.append(clock.now() - self.start)

    times: dict[Any, list[float]] = {c: [] for c in settings}
    swapped: dict[Any, dict[str, int]] = {}
    for order in (settings, settings[::-1]):
        for c in order:
            torch.manual_seed(0)
            timer = StepTimer()
            callbacks: list[pl.Callback] = [timer] if c is None else [BandLimit(compression=c), timer]
            model = ImageClassifier(cfg["backbone"], num_classes=10, width=cfg["width"])
            trainer = pl.Trainer(
                accelerator=args.device,
                devices=1,
                max_steps=per_pass,
                limit_val_batches=0,
                callbacks=callbacks,
                **QUIET,
            )
            data = pl.LightningDataModule.from_datasets(
                TensorDataset(images, labels), batch_size=cfg["batch"]
            )
            trainer.fit(model, data)
            times[c] += timer.times[args.warmup :]
            swapped[c] = _swapped(model)
    plain = statistics.median(times[None])
    return {
        c: dict(
            step_ms=[1000 * t for t in times[c]],
            median_ms=1000 * statistics.median(times[c]),
            ratio=statistics.median(times[c]) / plain,
            spread=tuple(q / plain for q in _quartiles(times[c])),
            swapped=swapped[c],
        )
        for c in settings
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--paths", nargs="+", default=["bare", "trainer"], choices=["bare", "trainer"])
    parser.add_argument("--compressions", nargs="+", type=float, default=[0.0, 0.5, 0.75])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 9; 3 with --quick)")
    parser.add_argument("--tf32", default="off", choices=["off", "on", "both"], help="CUDA only")
    parser.add_argument("--quick", action="store_true", help="small models and batches (a smoke run)")
    parser.add_argument(
        "--checkpoint", action="store_true", help="every block checkpointed in every setting (bare path)"
    )
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (3 if args.quick else 9)
    if args.checkpoint and "trainer" in args.paths:
        parser.error("--checkpoint times the bare path only: add --paths bare")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        torch.backends.cudnn.benchmark = True
    models = QUICK_MODELS if args.quick else MODELS
    tf32_modes = ["off", "on"] if args.tf32 == "both" else [args.tf32]
    if args.device == "cpu":
        tf32_modes = ["off"]
    suffix = ("-quick" if args.quick else "") + ("-checkpointed" if args.checkpoint else "")
    output = args.output or RESULTS / f"model_speed-{args.device}{suffix}.json"
    settings: list[float | None] = [None, *args.compressions]

    records: list[dict[str, Any]] = []
    lines: list[str] = []
    all_pass = True
    for tf32 in tf32_modes:
        if args.device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32 == "on"
        for name in args.models:
            cfg = models[name]
            for path in args.paths:
                print(f"  timing {name} {path}", file=sys.stderr, flush=True)
                results = (_bare if path == "bare" else _trainer)(cfg, settings, args)
                tag = f", TF32 {tf32}" if args.device == "cuda" else ""
                lines.append(
                    f"\n{name} (width {cfg['width'] or 'torchvision'}, batch {cfg['batch']}, "
                    f"{cfg['size']}x{cfg['size']}), path: {path}, device: {args.device}{tag}"
                    + (", every block checkpointed (ratios to checkpointed plain)" if args.checkpoint else "")
                )
                lines.append(f"{'setting':<8} {'median ms':>10} {'ratio':>6} {'IQR':>13} {'target':>13}")
                for c, row in results.items():
                    targets = CHECKPOINTED_TARGETS if args.checkpoint else TARGETS[name]
                    target = None if c is None or args.quick else targets.get(c)
                    ok = target is None or row["ratio"] <= target
                    all_pass &= ok
                    verdict = "" if target is None else f"<={target:.2f} {'PASS' if ok else 'MISS'}"
                    low, high = row["spread"]
                    lines.append(
                        f"{_label(c):<8} {row['median_ms']:>10.1f} {row['ratio']:>6.3f} "
                        f"{f'{low:.2f}-{high:.2f}':>13} {verdict:>13}"
                    )
                    records.append(
                        dict(
                            model=name,
                            path=path,
                            checkpointed=args.checkpoint,
                            compression=c,
                            tf32=tf32 if args.device == "cuda" else None,
                            target=target,
                            passed=None if target is None else ok,
                            **cfg,
                            **row,
                        )
                    )
    print("\n".join(lines))
    print(
        f"\nall targets: {'PASS' if all_pass else 'MISS'}{' (no targets with --quick)' if args.quick else ''}"
    )
    write_result(
        output,
        "model_speed",
        "benchmarks.speed.model_speed",
        sys.argv[1:] if argv is None else argv,
        {"records": records, "all_targets_pass": all_pass},
        {
            "torch": torch.__version__,
            "device": device_name(torch.device(args.device)),
            "threads": args.threads,
            "warmup": args.warmup,
            "repeats": args.repeats,
        },
    )
    print(f"results: {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
