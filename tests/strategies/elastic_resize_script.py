"""Run by test_elastic_ddp.py: train on N CPU processes (gloo), optionally resuming, save a checkpoint.

argv: devices max_steps out_dir [resume_checkpoint]
"""

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_bandlimit.strategies import ElasticDDPStrategy, LinearScaling


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class Report(pl.Callback):
    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: object) -> None:
        if trainer.is_global_zero and not self.out.exists():  # the LR the first step after (re)start uses
            strategy = trainer.strategy
            group = trainer.optimizers[0].param_groups[0]
            self.out.write_text(json.dumps({
                "world_size": trainer.world_size, "lr": group["lr"], "momentum": group["momentum"],
                "resized_from": strategy.resized_from, "reference_lr": strategy.reference.lr,
                "reference_world_size": strategy.reference.world_size, "samples_seen": strategy.samples_seen,
            }))


if __name__ == "__main__":
    devices, max_steps, out_dir = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    resume = sys.argv[4] if len(sys.argv) > 4 else None
    pl.seed_everything(0)
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    trainer = pl.Trainer(
        accelerator="cpu", devices=devices, strategy=ElasticDDPStrategy(rule=LinearScaling(warmup_steps=0)),
        max_steps=max_steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[Report(out_dir / f"start-{devices}.json")],
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=8), ckpt_path=resume)
    trainer.save_checkpoint(out_dir / f"after-{devices}.ckpt")
