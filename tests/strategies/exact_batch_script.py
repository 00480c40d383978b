"""Run by the exact-global-batch parity tests: one launch of an elastic job (gloo, CPU, float64).

argv[1]: JSON with keys devices, max_steps, out (dir), tag, global_batch, micro_batches;
optional: resume ("last"), dataset (256), batch (the loader's own batch_size, 8: the rule
replaces it), batchnorm (false), sync_batchnorm (false), every (checkpoint every N steps, 1).

Each rank writes <out>/<tag>-rank<r>.json: per micro-batch the global step, the sample indices,
the loss, the accumulation and the world size; rank 0 also writes <out>/<tag>-final.pt with the
final ``state_dict`` (parameters and BatchNorm buffers).
"""

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_bandlimit.callbacks import ElasticCheckpoint
from lightning_bandlimit.strategies import ElasticDDPStrategy, ExactGlobalBatch, SampleSchedule


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
    def __init__(self, batchnorm: bool, total: int) -> None:
        super().__init__()
        norm = nn.BatchNorm1d(16) if batchnorm else nn.Identity()
        self.net = nn.Sequential(nn.Linear(8, 16), norm, nn.Tanh(), nn.Linear(16, 2))
        self.total = total
        self.trained: list[dict] = []

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y, idx = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.trained.append(
            {
                "step": self.global_step,
                "indices": idx.tolist(),
                "loss": loss.item(),
                "accumulation": self.trainer.accumulate_grad_batches,
                "world_size": self.trainer.world_size,
                "lr": self.trainer.optimizers[0].param_groups[0]["lr"],
            }
        )
        return loss

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        opt = torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.9)
        schedule = SampleSchedule(opt, total_samples=self.total, kind="cosine", min_lr_ratio=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def main() -> None:
    cfg = json.loads(sys.argv[1])
    out = Path(cfg["out"])
    pl.seed_everything(0)
    dataset = cfg.get("dataset", 256)
    rule = ExactGlobalBatch(cfg["global_batch"], micro_batches=cfg["micro_batches"])
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=cfg["devices"],
        strategy=ElasticDDPStrategy(rule=rule, guard=False, cpu_threads=1),
        precision="64-true",
        sync_batchnorm=cfg.get("sync_batchnorm", False),
        max_steps=cfg["max_steps"],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            ElasticCheckpoint(
                dirpath=out / "ckpt",
                every_n_train_steps=cfg.get("every", 1),
                save_top_k=-1,
                filename="{step}",
            )
        ],
    )
    # created in float64: a float32 model would round the float64 checkpoint it resumes from
    with trainer.init_module():
        model = Model(cfg.get("batchnorm", False), total=cfg["max_total_steps"] * cfg["global_batch"])
    loader = DataLoader(Indexed(dataset), batch_size=cfg.get("batch", 8), shuffle=True)
    trainer.fit(model, loader, ckpt_path=cfg.get("resume"))
    (out / f"{cfg['tag']}-rank{trainer.global_rank}.json").write_text(json.dumps({"trained": model.trained}))
    if trainer.global_rank == 0:
        torch.save(
            {k: v.detach().cpu() for k, v in model.state_dict().items()}, out / f"{cfg['tag']}-final.pt"
        )


if __name__ == "__main__":
    main()
