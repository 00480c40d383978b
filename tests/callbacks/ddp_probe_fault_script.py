"""Run by test_probe_faults.py: 2-process CPU DDP where only rank 1's probe fails, first twice,
then for good (it stops after PROBE_FAILURES_TO_STOP in a row): every rank must skip the same
checks and train to the end (a rank that skipped the collective alone would hang the others)."""

import os

import lightning.pytorch as pl
from _helpers import SCRIPTED_ADAPTIVE, Report, cpu_trainer

from lightning_bandlimit.callbacks import AdaptiveBandLimit
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.models import ImageClassifier

M = 1_000_000
STEPS = 12
FAILING_READS = {2, 3} | set(range(6, 100))  # rank 1's reads that fail (0-based)


class FailingProbe(ScriptedProbe):
    """A scripted probe whose reads in ``FAILING_READS`` raise ``OSError``."""

    def read(self):  # type: ignore[no-untyped-def]
        if self.reads in FAILING_READS:
            self.reads += 1
            raise OSError("sensor busy")
        return super().read()


if __name__ == "__main__":
    pl.seed_everything(0)
    rank = int(os.environ.get("LOCAL_RANK", 0))
    probe_class = FailingProbe if rank == 1 else ScriptedProbe
    adaptive = AdaptiveBandLimit(probe=probe_class(free=[80 * M] * 100, total=100 * M), **SCRIPTED_ADAPTIVE)

    def report(trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict:
        return {
            "checks": [d["step"] for d in adaptive.decisions],
            "steps": trainer.global_step,
            "probe_stopped": adaptive.probe is None,
        }

    trainer = cpu_trainer(
        [adaptive, Report(report)], devices=2, strategy="ddp", max_steps=STEPS, limit_val_batches=0
    )
    trainer.fit(
        ImageClassifier("cifar_resnet18", width=4),
        SyntheticImageDataModule(train_size=256, val_size=8, batch_size=8),
    )
