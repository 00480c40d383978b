"""Run by ``test_zoo_peer_health.py``: a torchvision or timm model (argv[1]) in channels_last with
``bf16-mixed`` through ``ElasticDDPStrategy``'s peer health, 2 CPU processes by Lightning's
launcher. Two phases in one launch (a launch is most of the cost): for ``PHASE`` steps the ranks
run evenly, then rank 1 sleeps ``argv[2]`` seconds more in each training step (a straggler).

Each rank writes ``$BANDLIMIT_OUT/rank<r>.json`` at the end of each phase (``even``, ``slow``):
the stragglers reported, the forward times the ranks gathered, whether the watchdog ran, the
losses and a checksum of the weights.
"""

import sys
import time

import lightning.pytorch as pl
import torch
from _helpers import Report
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_bandlimit.strategies import ElasticDDPStrategy

PHASE = 6  # optimizer steps per phase


def build(name: str) -> nn.Module:
    library, _, model = name.partition(":")
    if library == "timm":
        import timm

        return timm.create_model(model, pretrained=False, num_classes=10)
    import torchvision

    return getattr(torchvision.models, model)(weights=None, num_classes=10)


class Classifier(pl.LightningModule):
    def __init__(self, name: str, extra_sleep: float) -> None:
        super().__init__()
        self.net = build(name).to(memory_format=torch.channels_last)
        self.extra_sleep = extra_sleep
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        if self.global_rank == 1 and self.global_step >= PHASE:
            time.sleep(self.extra_sleep)
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x.contiguous(memory_format=torch.channels_last)), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


class EvenPhase(pl.Callback):
    """What ``collect`` returns at the end of the even phase, kept for the rank's report."""

    def __init__(self) -> None:
        self.report: dict = {}

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, *args: object) -> None:
        if trainer.global_step == PHASE:
            self.report = collect(trainer, module)


def collect(trainer: pl.Trainer, module: Classifier) -> dict:
    strategy = trainer.strategy
    return {
        "stragglers": [s.rank for s in strategy.stragglers],
        "window": strategy._detector.state_dict()["window"],
        "watchdog": strategy._watchdog is not None,
        "losses": list(module.losses),
        "precision": str(trainer.precision),
        "channels_last": all(
            p.is_contiguous(memory_format=torch.channels_last) for p in module.parameters() if p.dim() == 4
        ),
        "checksum": float(sum(p.detach().double().sum() for p in module.parameters())),
    }


if __name__ == "__main__":
    name, extra_sleep = sys.argv[1], float(sys.argv[2])
    pl.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.rand(64, 3, 32, 32, generator=g), torch.randint(0, 10, (64,), generator=g))
    even = EvenPhase()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        precision="bf16-mixed",
        strategy=ElasticDDPStrategy(hang_timeout=30.0, slow_factor=2.0, slow_steps=3, cpu_threads=1),
        max_steps=2 * PHASE,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[even, Report(lambda t, m: {"even": even.report, "slow": collect(t, m)})],
    )
    trainer.fit(Classifier(name, extra_sleep), DataLoader(data, batch_size=4, shuffle=True))
