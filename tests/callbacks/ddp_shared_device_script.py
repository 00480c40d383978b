"""Run by test_shared_device.py: a 2-process CPU DDP job with SharedDevice on the ledger folder
``$BANDLIMIT_LEDGER``, slowed to a quarter second a step so that a newcomer the test announces
arrives while it trains. Free memory stays calm (the ladder only holds)."""

import os
import time

import lightning.pytorch as pl
from _helpers import SCRIPTED_ADAPTIVE, Report, cpu_trainer

from lightning_bandlimit.callbacks import AdaptiveBandLimit, SharedDevice
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.models import ImageClassifier

M = 1_000_000
STEPS = 48


class Slow(pl.Callback):
    def on_train_batch_end(self, *args: object) -> None:
        time.sleep(0.25)


if __name__ == "__main__":
    pl.seed_everything(0)
    adaptive = AdaptiveBandLimit(probe=ScriptedProbe(free=[30 * M], total=100 * M), **SCRIPTED_ADAPTIVE)
    shared = SharedDevice(os.environ["BANDLIMIT_LEDGER"], job="ddp")

    def report(trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict:
        return {
            "timeline": [(d["step"], d["rung"], d["compression"]) for d in adaptive.decisions],
            "steps": trainer.global_step,
            "holds": shared.holds,
        }

    trainer = cpu_trainer(
        [adaptive, shared, Slow(), Report(report)],
        devices=2,
        strategy="ddp",
        max_steps=STEPS,
        limit_val_batches=0,
    )
    trainer.fit(
        ImageClassifier("cifar_resnet18", width=4),
        SyntheticImageDataModule(train_size=512, val_size=8, batch_size=8),
    )
