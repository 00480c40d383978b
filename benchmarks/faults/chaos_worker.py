"""The training job of the chaos soak (``chaos.py``), started by torchrun on every (re)start.

argv[1]: JSON with keys out, steps, global_batch, micro_batch, dataset, every, step_sleep,
ballast_mb, join_timeout, hang_timeout, slow_factor, slow_steps (the last four go to
``ElasticDDPStrategy``). Float64, ``ExactGlobalBatch`` with one micro-batch size, a seeded
dataset, no dropout or augmentation: every random source is the sampler's seeded permutation, so
what each optimizer step trains on is a function of the step alone.

The model is tiny; ``step_sleep`` stands for each micro-batch's compute and is slept in the
forward (``training_step``), where the strategy's straggler detector times a rank: a worker the
driver slows down (``worker-slow``: stopped and continued again and again) is slow where a slow
device would be.

What it leaves for the judge, all under ``out``:

* ``records/<generation>-rank<r>.jsonl``: a header line (the generation, the checkpoint and step
  it resumed from, world size, pid, start time), then one line per micro-batch (global step,
  sample indices, learning rate), flushed as written: a killed worker's lines survive it.
* ``progress-rank<r>.json``: the latest step and the worker's pid (the driver picks its targets).
* ``final.pt`` and ``done.json`` (rank 0) when the run finishes.

``exit-abort``: a file ``abort-at-exit-<pid>`` the driver writes makes that worker end as a C++
abort at interpreter exit does (SIGABRT, after every exit handler, the strategy's included), once:
the file is removed as it fires.

A generation is one start of the whole group (rank 0's launch id, broadcast). Each checkpoint
carries the generation that wrote it, so the judge can follow the chain of checkpoints back from
the finished generation: that chain is the surviving history.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_bandlimit.callbacks import ElasticCheckpoint
from lightning_bandlimit.strategies import ElasticDDPStrategy, ExactGlobalBatch, SampleSchedule
from lightning_bandlimit.utils.files import atomic_write_json


class Indexed(Dataset):
    def __init__(self, size: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 8, generator=g, dtype=torch.float64)
        self.y = (self.x[:, 0] + 0.5 * torch.randn(size, generator=g, dtype=torch.float64) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        return self.x[i], self.y[i], i


class Model(pl.LightningModule):
    def __init__(self, total_samples: int, step_sleep: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 2))
        self.total_samples = total_samples
        self.step_sleep = step_sleep

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y, _ = batch
        time.sleep(self.step_sleep)  # the compute of a real model's forward (see the module docstring)
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        opt = torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.9)
        schedule = SampleSchedule(opt, total_samples=self.total_samples, kind="cosine", min_lr_ratio=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class Recorder(pl.Callback):
    """Writes what each generation resumed from and trained on (see the module docstring)."""

    def __init__(self, out: Path, ballast_mb: float) -> None:
        self.out = out
        # weight in the checkpoint, so that writing it takes long enough to be interrupted
        self.ballast = torch.zeros(int(ballast_mb * 2**20) // 8, dtype=torch.float64)
        self.generation = ""
        self.resumed_from: dict[str, Any] | None = None
        self._file: Any = None
        self._step = 0

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.generation = trainer.strategy.broadcast(f"{time.time_ns()}-{os.getpid()}", src=0)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict
    ) -> None:
        checkpoint["chaos"] = {
            "generation": self.generation,
            "step": trainer.global_step,
            "ballast": self.ballast,
        }

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict
    ) -> None:
        saved = checkpoint["chaos"]
        self.resumed_from = {"generation": saved["generation"], "step": saved["step"]}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        folder = self.out / "records"
        folder.mkdir(exist_ok=True)
        self._file = open(folder / f"{self.generation}-rank{trainer.global_rank}.jsonl", "a")  # noqa: SIM115
        self._write(
            {
                "generation": self.generation,
                "rank": trainer.global_rank,
                "world_size": trainer.world_size,
                "resumed_from": self.resumed_from,
                "start_step": trainer.global_step,
                "pid": os.getpid(),
                "restart_count": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", -1)),
                "t": time.time(),
            }
        )

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step = trainer.global_step
        self._lr = trainer.optimizers[0].param_groups[0]["lr"]  # the LR this step trains with

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._write(
            {
                "step": self._step,
                "indices": batch[2].tolist(),
                "lr": self._lr,
                "saved": trainer.checkpoint_callback.last_saved_step,  # type: ignore[union-attr]
                "t": time.time(),
            }
        )
        atomic_write_json(
            self.out / f"progress-rank{trainer.global_rank}.json",
            {
                "step": trainer.global_step,
                "rank": trainer.global_rank,
                "pid": os.getpid(),
                "generation": self.generation,
                "t": time.time(),
            },
        )

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._file is not None:
            self._file.close()


def _abort_if_armed(out: Path) -> None:
    """The driver's ``exit-abort``: abort this process at its exit, once (the file is the flag)."""
    try:
        (out / f"abort-at-exit-{os.getpid()}").unlink()
    except FileNotFoundError:
        return
    sys.stderr.write(f"chaos worker {os.getpid()}: aborting at exit (exit-abort)\n")
    sys.stderr.flush()
    os.abort()


def main() -> None:
    cfg = json.loads(sys.argv[1])
    out = Path(cfg["out"])
    atexit.register(_abort_if_armed, out)  # first registered, so it runs after every other handler
    pl.seed_everything(0, verbose=False)
    rule = ExactGlobalBatch(cfg["global_batch"], micro_batches=[cfg["micro_batch"]])
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=ElasticDDPStrategy(
            rule=rule,
            guard=False,
            cpu_threads=1,
            join_timeout=cfg["join_timeout"],
            hang_timeout=cfg.get("hang_timeout", 60.0),
            slow_factor=cfg.get("slow_factor", 2.0),
            slow_steps=cfg.get("slow_steps", 20),
        ),
        precision="64-true",
        max_steps=cfg["steps"],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            ElasticCheckpoint(dirpath=out / "ckpt", every_n_train_steps=cfg["every"]),
            Recorder(out, cfg["ballast_mb"]),
        ],
    )
    with trainer.init_module():  # float64 from the start: a float32 model would round the checkpoint
        model = Model(total_samples=cfg["steps"] * cfg["global_batch"], step_sleep=cfg["step_sleep"])
    loader = DataLoader(Indexed(cfg["dataset"]), batch_size=cfg["micro_batch"], shuffle=True)
    trainer.fit(model, loader, ckpt_path="last")
    if trainer.global_rank == 0:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, out / "final.pt")
        recorder = next(c for c in trainer.callbacks if isinstance(c, Recorder))  # type: ignore[attr-defined]
        atomic_write_json(
            out / "done.json",
            {
                "step": trainer.global_step,
                "world_size": trainer.world_size,
                "generation": recorder.generation,
            },
        )


if __name__ == "__main__":
    main()
