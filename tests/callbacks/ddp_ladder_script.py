"""Run by test_adaptive_ladder.py: 2-process CPU DDP over the ladder; only rank 1's probe sees
pressure, and rank 1 checkpoints only the first two stages (a lower top rung, as max_slowdown
can leave one rank with), so the ranks first agree on the top rung, then on the ladder position.
With ``LADDER_RUNG_ORDER=cost`` both ranks have every unit and the cost-ordered rungs (pointwise) (each rank
times its own first step): the ranks must run rank 0's rungs."""

import os
import time

import lightning.pytorch as pl
from _helpers import SCRIPTED_ADAPTIVE, Report, cpu_trainer

from lightning_bandlimit import bandlimited_layers
from lightning_bandlimit.callbacks import AdaptiveBandLimit
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.recompute.switch import is_checkpointed

M = 1_000_000
# min_free 20 MB and release_free 40 MB of 100 MB; rank 1 comes near min_free slowly, then
# under it (see test_adaptive_ladder.PRESSURE)
TRACES = {
    0: [80 * M] * 16,
    1: [80 * M] * 3 + [30 * M, 20_100_000] + [19_900_000] * 3 + [80 * M] * 8,
}
# rank 1's units: backbone.3-6, the first two of rank 0's four stages
COST = os.environ.get("LADDER_RUNG_ORDER") == "cost"
UNITS = {0: None, 1: None if COST else ["backbone.[3-6]"]}
STEPS = 16


class Checkpointed(pl.Callback):
    """Which blocks are checkpointed as each training batch starts."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: object) -> None:
        self.seen.append([n for n, m in pl_module.named_modules() if is_checkpointed(m)])


if __name__ == "__main__":
    pl.seed_everything(0)
    rank = int(os.environ.get("LOCAL_RANK", 0))
    adaptive = AdaptiveBandLimit(
        probe=ScriptedProbe(free=TRACES[rank], total=100 * M),
        checkpoint_units=UNITS[rank],
        levers=("checkpoint", "compression"),  # the rungs and the continuum agreed (splits: unit tests)
        **{**SCRIPTED_ADAPTIVE, "rung_order": "pointwise" if COST else "stages"},
    )
    spy = Checkpointed()

    def report(trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict:
        return {
            "timeline": [(d["step"], d["rung"], d["compression"]) for d in adaptive.decisions],
            "checkpointed": spy.seen,
            "steps": trainer.global_step,
            "top": adaptive.controller.top,
            "rungs": adaptive.controller.rungs,
            "plan": adaptive._rungs.stages.stages if adaptive._rungs.stages is not None else None,
            "layers": [(n, layer.compression) for n, layer in bandlimited_layers(pl_module)],
        }

    model = ImageClassifier("cifar_resnet18", width=4)
    if COST and rank == 1:  # rank 1 times its highest-resolution units as far dearer: its own order differs
        for name in ("backbone.3", "backbone.4"):
            model.get_submodule(name).register_forward_hook(lambda *_: time.sleep(0.05))
    trainer = cpu_trainer(
        [adaptive, spy, Report(report)], devices=2, strategy="ddp", max_steps=STEPS, limit_val_batches=0
    )
    trainer.fit(
        model,
        SyntheticImageDataModule(train_size=256, val_size=8, batch_size=8),
    )
