"""What a ghost batch costs: the split's gradient against the whole batch's, by chunk size, beside
the compression's gradient against the plain model's.

A model with BatchNorm in training mode normalises each chunk of a split batch by the chunk's own
statistics (ghost batches), so the micro-batch lever is approximate there (issue 69;
``AdaptiveBandLimit(ghost_batch=32)`` allows it only for chunks of at least 32 samples). This
measures by how much, on the product's own judgement
(:func:`lightning_bandlimit.microbatch.split_trial`, training mode with dropout held off: its
``batch_norm_difference``, ``||g_split - g_whole|| / ||g_whole||`` over all parameters), in float64
on a batch of ``--batch`` random 32x32 images, for each chunk size in ``--chunks``; and, for
scale, the compression's difference ``||g_c - g_0|| / ||g_0||`` on the same batch (the whole
batch, training mode, ``bandlimit(model, c)`` against the plain model) for each ``c`` in
``--compressions``. The two are not at equal memory: this is the gradient each lever changes,
not the ordering the ladder should take between them (not built: issue 69, item 2). One seed
per ``--seeds`` entry fixes the weights and the batch; the table gives the mean and the range.

    .venv/bin/python -m benchmarks.accuracy.ghost_batches  # about 4 minutes on 2 cores
    .venv/bin/python -m benchmarks.accuracy.ghost_batches --seeds 0 --chunks 8 2  # a smoke run
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.common.provenance import RESULTS, versions, write_result
from lightning_bandlimit import bandlimit
from lightning_bandlimit.microbatch import split_trial
from lightning_bandlimit.models.backbones import cifar_resnet18

MODULE = "benchmarks.accuracy.ghost_batches"
MODELS = ("cifar_resnet18", "torchvision_resnet18")


def build(name: str) -> nn.Module:
    """A fresh, randomly initialised 10-class model in float64."""
    if name == "cifar_resnet18":
        return cifar_resnet18(10, width=16).double()
    if name == "torchvision_resnet18":
        import torchvision

        return torchvision.models.resnet18(weights=None, num_classes=10).double()
    raise ValueError(f"model must be one of {MODELS}, got {name!r}")


class _Classifier(pl.LightningModule):
    """The model under a per-sample mean cross-entropy, as a user's LightningModule has it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.model(x), y)


def _batch(seed: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randn(size, 3, 32, 32, generator=g, dtype=torch.float64), torch.randint(
        0, 10, (size,), generator=g
    )


def _gradient(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    x, y = batch
    F.cross_entropy(model(x), y).backward()
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def _relative(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    num = sum(float((a - b).square().sum()) for a, b in zip(got, want)) ** 0.5
    den = sum(float(b.square().sum()) for b in want) ** 0.5
    return num / den


def measure(
    name: str, seed: int, batch_size: int, chunks: Sequence[int], compressions: Sequence[float]
) -> dict:
    """One model and seed: the split's training-mode difference per chunk size, the compression's
    per level."""
    torch.manual_seed(seed)
    model = build(name).train()
    batch = _batch(seed, batch_size)
    ghost: dict[str, float] = {}
    for chunk in chunks:
        trial = split_trial(_Classifier(model), batch, 0, split=batch_size // chunk)
        assert trial.exact, trial.reason  # eval mode: the loss allows a split
        assert trial.batch_norm_difference is not None
        ghost[str(chunk)] = trial.batch_norm_difference
    plain = _gradient(model, batch)
    compression: dict[str, float] = {}
    for c in compressions:
        limited = bandlimit(copy.deepcopy(model), c)
        got = _gradient(limited, batch)
        compression[str(c)] = _relative(got, plain)
    return {"ghost": ghost, "compression": compression}


def _summary(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--chunks", nargs="+", type=int, default=[32, 16, 8, 4, 2])
    parser.add_argument("--compressions", nargs="+", type=float, default=[0.3, 0.5, 0.9])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", type=Path, default=RESULTS / "ghost_batches.json")
    args = parser.parse_args(argv)
    if any(args.batch % c or c < 2 or c >= args.batch for c in args.chunks):
        parser.error(
            f"each chunk must divide --batch {args.batch} in 2 or more chunks of 2 or more, got {args.chunks}"
        )
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models:
        runs = [measure(name, s, args.batch, args.chunks, args.compressions) for s in args.seeds]
        row = {
            "model": name,
            "ghost": {c: _summary([r["ghost"][str(c)] for r in runs]) for c in map(str, args.chunks)},
            "compression": {
                c: _summary([r["compression"][str(c)] for r in runs]) for c in map(str, args.compressions)
            },
            "runs": runs,
        }
        rows.append(row)
        print(f"{name} (batch {args.batch}, float64, {len(args.seeds)} seeds: mean [min, max])")
        for c, s in row["ghost"].items():
            print(f"  split, chunks of {c:>2}: {s['mean']:.3g} [{s['min']:.3g}, {s['max']:.3g}]")
        for c, s in row["compression"].items():
            print(f"  compression {c}:      {s['mean']:.3g} [{s['min']:.3g}, {s['max']:.3g}]")
    body = {
        "what": "relative L2 difference of the gradient: split (training mode, dropout off) vs the whole "
        "batch, by chunk size; compression vs the plain model",
        "batch": args.batch,
        "seeds": args.seeds,
        "rows": rows,
    }
    argv_used = sys.argv[1:] if argv is None else list(argv)
    write_result(
        args.output, "ghost_batches", MODULE, argv_used, body, {**versions(), "threads": args.threads}
    )
    print(f"wrote {args.output}")
    return body


if __name__ == "__main__":
    main()
