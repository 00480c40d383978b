"""Run by test_band_limit.py: 2-process CPU DDP with BandLimit; each rank reports its layers."""

import json
import os
from pathlib import Path

import lightning.pytorch as pl

from lightning_bandlimit import bandlimited_layers
from lightning_bandlimit.callbacks import BandLimit
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.lean_layers import LeanModule
from lightning_bandlimit.models import ImageClassifier


class Report(pl.Callback):
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        layers = [(name, layer.compression) for name, layer in bandlimited_layers(pl_module)]
        weights = pl_module.backbone[0].weight.detach().flatten()[:8].tolist()
        lean = sum(isinstance(m, LeanModule) for m in pl_module.modules())
        out = Path(os.environ["BANDLIMIT_OUT"]) / f"rank{trainer.global_rank}.json"
        out.write_text(
            json.dumps({"world_size": trainer.world_size, "layers": layers, "weights": weights, "lean": lean})
        )


if __name__ == "__main__":
    pl.seed_everything(0)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[BandLimit(compression=0.5, memory_lean=os.environ["BANDLIMIT_LEAN"] == "1"), Report()],
    )
    trainer.fit(
        ImageClassifier("small_cnn", width=4),
        SyntheticImageDataModule(train_size=32, val_size=8, batch_size=4),
    )
