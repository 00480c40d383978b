"""Run by test_split_step.py: 2-process CPU DDP (gloo, float64), the same job trained twice in one
launch, whole and at split 2 (a SplitStep driven as the band-limit callback drives it).

Each rank writes ``$BANDLIMIT_OUT/rank<r>.json``: per run (``whole``, ``split``) the final weights,
the DDP gradient all-reduces (a comm hook counts its calls), the optimizer steps and, for the split
run, the chunks each step ran in.
"""

import json
import os
from pathlib import Path

import lightning.pytorch as pl
import torch
from _helpers import SplitDriver as Driver
from _helpers import close_process_group_at_exit, cpu_trainer
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.utils.data import DataLoader, TensorDataset


class Net(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class CountAllReduce(pl.Callback):
    """Counts DDP's gradient all-reduces: a comm hook on the wrapped model, registered before the
    first backward."""

    def __init__(self) -> None:
        self.calls = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        def hook(state: object, bucket: torch.distributed.GradBucket) -> torch.futures.Future[torch.Tensor]:
            self.calls += 1
            return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]

        trainer.strategy.model.register_comm_hook(None, hook)  # type: ignore[union-attr]


def run(split: int | None) -> tuple[dict, int]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 5, generator=g, dtype=torch.float64)
    data = TensorDataset(x, torch.randint(0, 3, (64,), generator=g))
    counter = CountAllReduce()
    driver = Driver(split) if split is not None else None
    module = Net()
    trainer = cpu_trainer(
        [counter, *([driver] if driver is not None else [])],
        devices=2,
        strategy="ddp",
        max_epochs=2,
        precision="64-true",
    )
    trainer.fit(module, DataLoader(data, batch_size=8))
    return {
        "weights": torch.cat([p.detach().flatten() for p in module.parameters()]).tolist(),
        "allreduces": counter.calls,
        "steps": trainer.global_step,
        "chunks": driver.chunks if driver is not None else None,
    }, trainer.global_rank


if __name__ == "__main__":
    close_process_group_at_exit()
    whole, rank = run(None)
    split, _ = run(2)
    out = Path(os.environ["BANDLIMIT_OUT"]) / f"rank{rank}.json"
    out.write_text(json.dumps({"whole": whole, "split": split}))
