"""Run by test_adaptive_band_limit.py: 2-process CPU DDP; only rank 1's probe sees pressure."""

import os

import lightning.pytorch as pl
from _helpers import SCRIPTED_ADAPTIVE, Report, cpu_trainer

from lightning_bandlimit import bandlimited_layers
from lightning_bandlimit.callbacks import AdaptiveBandLimit
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.models import ImageClassifier

TRACES = {0: [800] * 12, 1: [800] * 2 + [100] * 3 + [800] * 7}


if __name__ == "__main__":
    pl.seed_everything(0)
    rank = int(os.environ.get("LOCAL_RANK", 0))
    adaptive = AdaptiveBandLimit(probe=ScriptedProbe(free=TRACES[rank], total=1000), **SCRIPTED_ADAPTIVE)

    def report(trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict:
        return {
            "timeline": [(d["step"], d["compression"]) for d in adaptive.decisions],
            "layers": [(n, layer.compression) for n, layer in bandlimited_layers(pl_module)],
        }

    trainer = cpu_trainer(
        [adaptive, Report(report)], devices=2, strategy="ddp", max_steps=12, limit_val_batches=0
    )
    trainer.fit(
        ImageClassifier("small_cnn", width=4),
        SyntheticImageDataModule(train_size=96, val_size=8, batch_size=4),
    )
