"""A unit that is not exact when checkpointed leaves the ladder at the first step, with one warning."""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import torchvision
from _helpers import SCRIPTED_ADAPTIVE, cpu_trainer, run_ddp_script
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_bandlimit.callbacks import AdaptiveBandLimit
from lightning_bandlimit.memory import ScriptedProbe

GIB = 2**30


class _Counting(nn.Module):
    """A residual-block-like unit whose output depends on how often it ran: its recompute differs."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x + self.conv2(self.conv1(x).relu()) * (1 + self.calls % 2)


class _Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.bn(self.conv1(x)).relu())


class _Module(pl.LightningModule):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        out = self.net(x)
        out = out.logits if hasattr(out, "logits") else out
        return nn.functional.cross_entropy(out, y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _data(size: int = 16, n: int = 32) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 3, size, size), torch.randint(0, 4, (n,))), batch_size=4)


def _climb(frees: list[int], **kwargs: object) -> AdaptiveBandLimit:
    unit = GIB // 1000
    probe = ScriptedProbe(free=[f * unit for f in frees], total=1000 * unit)
    return AdaptiveBandLimit(probe=probe, **{**SCRIPTED_ADAPTIVE, "max_compression": 0.9, **kwargs})


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_a_unit_whose_recompute_differs_leaves_the_ladder_with_one_warning(precision: str) -> None:
    # under bf16-mixed the units' recorded inputs are bf16: the trial runs them under that autocast
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), _Block(8), _Counting(8), nn.MaxPool2d(2), _Block(8),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
    )  # fmt: skip
    callback = _climb([100] * 12)  # a squeeze throughout: the ladder climbs to its top rung
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = cpu_trainer([callback], max_steps=6, limit_val_batches=0, precision=precision)
        trainer.fit(_Module(net), _data())
    messages = [str(w.message) for w in caught if "not exact when checkpointed" in str(w.message)]
    assert len(messages) == 1 and "net.2: checkpointed" in messages[0], messages
    assert callback._rungs.stages is None or "net.2" not in callback._rungs.stages.units
    assert max(d["rung"] for d in callback.decisions) == 2  # the two exact blocks, one stage each


def test_densenet_climbs_to_its_top_rung_and_back() -> None:
    # its layers take a list the block appends to: checkpointed naively, the recompute crashed
    net = torchvision.models.densenet121(num_classes=4)
    callback = _climb([5] * 4 + [900] * 8, levers=["checkpoint"])  # a squeeze, then the co-tenant leaves
    cpu_trainer([callback], max_steps=12, limit_val_batches=0).fit(_Module(net), _data(32, 48))
    rungs = [d["rung"] for d in callback.decisions]
    assert max(rungs) == 4 and rungs[-1] == 0  # 4 stages: the dense blocks


@pytest.mark.slow
def test_ddp_a_unit_failing_on_one_rank_leaves_the_ladder_on_every_rank(tmp_path: Path) -> None:
    ranks = run_ddp_script(Path(__file__).with_name("ddp_trials_script.py"), tmp_path)
    assert ranks[0]["steps"] == ranks[1]["steps"] == 6  # trained to the end, no hang
    assert ranks[0]["stages"] == ranks[1]["stages"] and ranks[0]["stages"]
    assert "net.2" not in [name for stage in ranks[0]["stages"] for name in stage]
    assert ranks[0]["timeline"] == ranks[1]["timeline"]
