"""Worker of the torchrun elastic test: a slow tiny job that resumes from its own last.ckpt.

argv: out_dir max_steps. Each launch writes <out>/launch-<ns>-rank<r>.json when training starts;
every step updates <out>/progress-rank<r>.json.
"""

import os
import sys
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_bandlimit.callbacks import ElasticCheckpoint
from lightning_bandlimit.strategies import ElasticDDPStrategy, LinearScaling
from lightning_bandlimit.utils.files import atomic_write_json


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        time.sleep(0.15)  # slow enough for the test to change the membership mid-run
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class LaunchReport(pl.Callback):
    """Writes what each launch starts from, and each step's progress (atomically: the test polls them)."""

    def __init__(self, out: Path) -> None:
        self.out = out

    started = False

    def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
        if self.started:  # the first batch of this launch: the strategy has applied its rule
            return
        self.started = True
        strategy = trainer.strategy
        atomic_write_json(
            self.out / f"launch-{time.time_ns()}-rank{trainer.global_rank}.json",
            {
                "world_size": trainer.world_size,
                "resized_from": strategy.resized_from,
                "step": trainer.global_step,
                "lr": trainer.optimizers[0].param_groups[0]["lr"],
                "restart": os.environ.get("TORCHELASTIC_RESTART_COUNT"),
                "pid": os.getpid(),
            },
        )

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        atomic_write_json(
            self.out / f"progress-rank{trainer.global_rank}.json",
            {"step": trainer.global_step, "world_size": trainer.world_size, "pid": os.getpid()},
        )


if __name__ == "__main__":
    out, max_steps = Path(sys.argv[1]), int(sys.argv[2])
    pl.seed_everything(0)
    data = TensorDataset(torch.randn(4096, 8), torch.randint(0, 2, (4096,)))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=ElasticDDPStrategy(rule=LinearScaling(warmup_steps=0)),
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ElasticCheckpoint(dirpath=out / "ckpt", every_n_train_steps=5), LaunchReport(out)],
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=8, shuffle=True), ckpt_path="last")
    atomic_write_json(
        out / f"done-rank{trainer.global_rank}.json",
        {"step": trainer.global_step, "world_size": trainer.world_size},
    )
