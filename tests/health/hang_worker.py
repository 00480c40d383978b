"""Worker of the hang test, run by torchrun (2 processes): a float64 job that resumes from its own
last checkpoint; on the first launch one rank stops itself (SIGSTOP) after a given step.

argv: out_dir max_steps hang_timeout stop_rank stop_step (stop_rank -1: no stop). Each rank
writes <out>/final-rank<r>.pt (its weights) when training ends, <out>/stopped.json when it stops,
and appends a line to <out>/starts.jsonl at each start (world size, step, learning rate).

The straggler test sets, per torchrun agent: ``HANG_WORKER_EXTRA_SLEEP`` (seconds more in each
training step of this agent's worker), ``HANG_WORKER_DROP=1`` (``drop_stragglers=True``) and
``HANG_WORKER_SLOW_STEPS`` (``slow_steps``).
"""

import json
import os
import signal
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
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)).double()

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        # a few steps per heartbeat (0.5 s): the step a hang names lags by at most 3
        time.sleep(0.2 + float(os.environ.get("HANG_WORKER_EXTRA_SLEEP", "0")))
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class StopAt(pl.Callback):
    """On the first launch only: rank ``rank`` stops itself after ``step``."""

    def __init__(self, out: Path, rank: int, step: int) -> None:
        self.out, self.rank, self.step = out, rank, step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        first = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first and trainer.global_rank == self.rank and trainer.global_step == self.step:
            atomic_write_json(self.out / "stopped.json", {"time": time.time(), "pid": os.getpid()})
            os.kill(os.getpid(), signal.SIGSTOP)


class Starts(pl.Callback):
    """Each (re)start of training: this rank's world size, step and learning rate, one JSON line."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.written = False

    def on_train_batch_start(self, trainer: pl.Trainer, *args: object) -> None:
        if self.written:
            return
        self.written = True
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "step": trainer.global_step,
            "lr": trainer.optimizers[0].param_groups[0]["lr"],
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
            "pid": os.getpid(),
        }
        with open(self.out / "starts.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    out, max_steps, hang_timeout = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    stop_rank, stop_step = int(sys.argv[4]), int(sys.argv[5])
    pl.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(512, 8, generator=g, dtype=torch.float64), torch.randint(0, 2, (512,), generator=g)
    )
    callbacks: list[pl.Callback] = [
        ElasticCheckpoint(dirpath=out / "ckpt", every_n_train_steps=2),
        Starts(out),
    ]
    if stop_rank >= 0:
        callbacks.append(StopAt(out, stop_rank, stop_step))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy=ElasticDDPStrategy(
            rule=LinearScaling(warmup_steps=0),
            hang_timeout=hang_timeout,
            cpu_threads=1,
            slow_steps=int(os.environ.get("HANG_WORKER_SLOW_STEPS", "20")),
            drop_stragglers=os.environ.get("HANG_WORKER_DROP") == "1",
        ),
        max_steps=max_steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=8, shuffle=True), ckpt_path="last")
    torch.save(trainer.lightning_module.state_dict(), out / f"final-rank{trainer.global_rank}.pt")
