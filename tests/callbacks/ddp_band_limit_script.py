"""Run by test_band_limit.py: 2-process CPU DDP with BandLimit; each rank reports its layers."""

import os

import lightning.pytorch as pl
from _helpers import Report, cpu_trainer

from lightning_bandlimit import bandlimited_layers
from lightning_bandlimit.callbacks import BandLimit
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.layers.lean import LeanModule
from lightning_bandlimit.models import ImageClassifier


def _report(trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict:
    return {
        "world_size": trainer.world_size,
        "layers": [(name, layer.compression) for name, layer in bandlimited_layers(pl_module)],
        "weights": pl_module.backbone[0].weight.detach().flatten()[:8].tolist(),
        "lean": sum(isinstance(m, LeanModule) for m in pl_module.modules()),
    }


if __name__ == "__main__":
    pl.seed_everything(0)
    trainer = cpu_trainer(
        [BandLimit(compression=0.5, memory_lean=os.environ["BANDLIMIT_LEAN"] == "1"), Report(_report)],
        devices=2,
        strategy="ddp",
        max_steps=2,
        limit_val_batches=0,
    )
    trainer.fit(
        ImageClassifier("small_cnn", width=4),
        SyntheticImageDataModule(train_size=32, val_size=8, batch_size=4),
    )
