"""Run by the elastic tests: one launch of an elastic job (gloo, CPU), possibly resuming.

argv[1]: JSON with keys devices, max_steps, out (dir), tag, rule ("linear", "keep", "x1000", ...),
optional: resume ("last" or a path), dataset (96), batch (8), every (checkpoint every N steps),
sigterm_at (send SIGTERM to every rank after this global step; with sigterm_rank, to that rank
only), guard (bool), optimizer ("sgd"/"adam"),
hidden (model width, to make an incompatible model), accumulation (1), resume_rank1 (rank 1
resumes this checkpoint instead of ``resume``).

Each rank writes <out>/<tag>-rank<r>.json: the indices it trained on, per step, with the LR and
the strategy's state, so the test can check exactly-once data, the schedule and the rule.
"""

import json
import os
import signal
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from _helpers import close_process_group_at_exit
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_bandlimit.callbacks import ElasticCheckpoint
from lightning_bandlimit.strategies import (
    AdaScale,
    ElasticDDPStrategy,
    KeepGlobalBatch,
    LinearScaling,
    MomentumAwareScaling,
    SampleSchedule,
    ScalingRule,
    SquareRootScaling,
    StabilityGuard,
    TrainingConfig,
)


class Indexed(Dataset):
    def __init__(self, size: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 8, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        return self.x[i], self.y[i], i


class Times1000(ScalingRule):
    """A deliberately bad rule: LR x 1000 (x 1000 ** damping)."""

    def adjust(
        self, reference: TrainingConfig, world_size: int, damping: float = 1.0, accumulation=None
    ) -> TrainingConfig:  # type: ignore[no-untyped-def]
        from dataclasses import replace

        return replace(reference, world_size=world_size, lr=reference.lr * 1000.0**damping)


RULES = {
    "linear": lambda: LinearScaling(warmup_steps=0),
    "linear-warmup": lambda: LinearScaling(warmup_steps=2),
    "keep": KeepGlobalBatch,
    "momentum": MomentumAwareScaling,
    "sqrt": SquareRootScaling,
    "adascale": AdaScale,
    "x1000": Times1000,
}


class Model(pl.LightningModule):
    def __init__(self, optimizer: str, total: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.Tanh(), nn.Linear(hidden, 2))
        self.optimizer_name, self.total = optimizer, total
        self.trained: list[dict] = []

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y, idx = batch
        group = self.trainer.optimizers[0].param_groups[0]
        strategy = self.trainer.strategy
        self.trained.append(
            {
                "epoch": self.current_epoch,
                "step": self.global_step,
                "indices": idx.tolist(),
                "lr": float(group["lr"]),
                "momentum": group.get("momentum"),
                "betas": group.get("betas"),
                "samples_seen": strategy.samples_seen,
                "accumulation": self.trainer.accumulate_grad_batches,
                "gain": strategy.gain,
                "world_size": self.trainer.world_size,
            }
        )
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.trained[-1]["loss"] = float(loss)
        return loss

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        if self.optimizer_name == "adam":
            opt = torch.optim.Adam(self.parameters(), lr=0.01)
        else:
            opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        schedule = SampleSchedule(opt, total_samples=self.total, kind="cosine", min_lr_ratio=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class SigtermAt(pl.Callback):
    def __init__(self, step: int, rank: int | None) -> None:
        self.step, self.rank = step, rank

    def on_train_batch_end(self, trainer, *args) -> None:  # type: ignore[no-untyped-def]
        if trainer.global_step == self.step and self.rank in (None, trainer.global_rank):
            os.kill(os.getpid(), signal.SIGTERM)


def main() -> None:
    close_process_group_at_exit()  # a rank once aborted at exit without it (as Report does)
    cfg = json.loads(sys.argv[1])
    out = Path(cfg["out"])
    pl.seed_everything(0)
    dataset = cfg.get("dataset", 96)
    model = Model(cfg.get("optimizer", "sgd"), total=3 * dataset, hidden=cfg.get("hidden", 4))
    guard = StabilityGuard(window=6, patience=2, tolerance=1.5) if cfg.get("guard", True) else False
    callbacks: list[pl.Callback] = [
        ElasticCheckpoint(
            dirpath=out / "ckpt", every_n_train_steps=cfg.get("every", 4), save_top_k=-1, filename="{step}"
        )
    ]
    if "sigterm_at" in cfg:
        callbacks.append(SigtermAt(cfg["sigterm_at"], cfg.get("sigterm_rank")))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=cfg["devices"],
        strategy=ElasticDDPStrategy(rule=RULES[cfg.get("rule", "linear")](), guard=guard),
        max_steps=cfg["max_steps"],
        accumulate_grad_batches=cfg.get("accumulation", 1),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    loader = DataLoader(Indexed(dataset), batch_size=cfg.get("batch", 8), shuffle=True)
    try:
        resume = cfg.get("resume_rank1") if os.environ.get("LOCAL_RANK") == "1" else None
        trainer.fit(model, loader, ckpt_path=resume or cfg.get("resume"))
    finally:
        strategy = trainer.strategy
        record = {
            "trained": model.trained,
            "resized_from": strategy.resized_from,
            "rollbacks": strategy.rollbacks,
            "threads": torch.get_num_threads(),
            "reference": None if strategy.reference is None else strategy.reference.__dict__,
            "applied": None if strategy.applied is None else strategy.applied.__dict__,
            "global_step": trainer.global_step,
            "noise": strategy.gradient_noise,
            "progress": [c.scheduler.progress for c in trainer.lr_scheduler_configs],
        }
        (out / f"{cfg['tag']}-rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
