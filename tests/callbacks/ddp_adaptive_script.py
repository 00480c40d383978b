"""Run by test_adaptive_band_limit.py: 2-process CPU DDP; only rank 1's probe sees pressure."""

import json
import os
from pathlib import Path

import lightning.pytorch as pl

from lightning_bandlimit import bandlimited_layers
from lightning_bandlimit.callbacks import AdaptiveBandLimit
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.models import ImageClassifier

TRACES = {0: [800] * 12, 1: [800] * 2 + [100] * 3 + [800] * 7}


class Report(pl.Callback):
    def __init__(self, adaptive: AdaptiveBandLimit) -> None:
        self.adaptive = adaptive

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        timeline = [(d["step"], d["compression"]) for d in self.adaptive.decisions]
        layers = [(n, layer.compression) for n, layer in bandlimited_layers(pl_module)]
        out = Path(os.environ["BANDLIMIT_OUT"]) / f"rank{trainer.global_rank}.json"
        out.write_text(json.dumps({"timeline": timeline, "layers": layers}))


if __name__ == "__main__":
    pl.seed_everything(0)
    rank = int(os.environ.get("LOCAL_RANK", 0))
    adaptive = AdaptiveBandLimit(
        probe=ScriptedProbe(free=TRACES[rank], total=1000),
        min_free=0.2,
        release_free=0.4,
        check_every_n_steps=1,
        raise_step=0.3,
        lower_step=0.1,
        release_checks=2,
        cooldown_checks=1,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=12,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[adaptive, Report(adaptive)],
    )
    trainer.fit(
        ImageClassifier("small_cnn", width=4),
        SyntheticImageDataModule(train_size=96, val_size=8, batch_size=4),
    )
