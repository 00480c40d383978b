"""Run by test_ladder_trials.py: 2-process CPU DDP; a unit whose recompute differs on rank 1 only
(its output depends on how often it ran there) leaves the ladder on both ranks."""

import os

import lightning.pytorch as pl
import torch
from _helpers import SCRIPTED_ADAPTIVE, Report, cpu_trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_bandlimit.callbacks import AdaptiveBandLimit
from lightning_bandlimit.memory import ScriptedProbe

M = 1_000_000


class Counting(nn.Module):
    """Exact on rank 0; on rank 1 its output depends on how often it ran (its recompute differs)."""

    def __init__(self, channels: int, counting: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.counting, self.calls = counting, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += self.counting
        return x + self.conv2(self.conv1(x).relu()) * (1 + self.calls % 2)


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.conv1(x).relu())


class Module(pl.LightningModule):
    def __init__(self, counting: bool) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), Block(8), Counting(8, counting), nn.MaxPool2d(2), Block(8),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
        )  # fmt: skip

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    pl.seed_everything(0)
    rank = int(os.environ.get("LOCAL_RANK", 0))
    adaptive = AdaptiveBandLimit(
        probe=ScriptedProbe(free=[10 * M] * 8, total=1000 * M),  # a squeeze throughout: climb
        **{**SCRIPTED_ADAPTIVE, "max_compression": 0.9},
    )

    def report(trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict:
        stages = adaptive._rungs.stages.stages if adaptive._rungs.stages is not None else None
        return {
            "units": sorted(adaptive._rungs.stages.units) if adaptive._rungs.stages is not None else [],
            "stages": stages,
            "timeline": [(d["step"], d["rung"], d["compression"]) for d in adaptive.decisions],
            "steps": trainer.global_step,
        }

    data = DataLoader(TensorDataset(torch.randn(64, 3, 16, 16), torch.randint(0, 4, (64,))), batch_size=4)
    trainer = cpu_trainer(
        [adaptive, Report(report)], devices=2, strategy="ddp", max_steps=6, limit_val_batches=0
    )
    trainer.fit(Module(counting=rank == 1), data)
