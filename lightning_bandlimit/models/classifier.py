"""``ImageClassifier``: a LightningModule around a backbone, for images in ``[0, 1]``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional as F
from torchmetrics.classification import MulticlassAccuracy

from lightning_bandlimit.models._lightning import advances_sample_schedules, training_loader
from lightning_bandlimit.models.backbones import build_backbone
from lightning_bandlimit.strategies.schedules import SampleSchedule
from lightning_bandlimit.utils.validation import check_choice, check_int, check_real

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "ImageClassifier", "Normalize"]

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


class Normalize(nn.Module):
    """Per-channel ``(x - mean) / std`` as the model's first layer (inputs stay in ``[0, 1]``).

    Args:
        mean: per-channel mean.
        std: per-channel standard deviation, all positive.

    Raises:
        ValueError: if the lengths differ or a std is not positive.

    Example:
        >>> Normalize((0.5,), (0.5,))(torch.ones(1, 1, 2, 2)).flatten().tolist()
        [1.0, 1.0, 1.0, 1.0]
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        if len(mean) != len(std) or any(s <= 0 for s in std):
            raise ValueError(f"mean and std must have equal lengths and positive std, got {mean} and {std}")
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


class ImageClassifier(pl.LightningModule):
    """Image classifier: normalisation inside, cross-entropy, torchmetrics accuracy.

    Inputs are images in ``[0, 1]`` (normalisation is the model's first layer, so attacks and
    band-limiting see raw pixels). The default optimiser is SGD with Nesterov momentum under a
    one-cycle schedule stepped every batch; from the command line ``--optimizer`` and
    ``--lr_scheduler`` (any ``class_path``) replace it, as LightningCLI does for any module.
    Logged: ``train/loss``, ``train/acc``, ``val/loss``, ``val/acc``, ``test/loss``, ``test/acc``.

    Args:
        backbone: ``"cifar_resnet18"``, ``"small_cnn"`` or a ``torchvision.models`` name.
        num_classes: number of classes.
        width: base width of our own backbones (their default when ``None``).
        mean: per-channel mean used by the normalisation layer.
        std: per-channel standard deviation used by the normalisation layer.
        learning_rate: peak learning rate of the one-cycle schedule.
        momentum: SGD momentum.
        weight_decay: SGD weight decay.
        label_smoothing: cross-entropy label smoothing.
        lr_schedule: ``"onecycle"`` (stepped per optimizer step) or ``"samples"``: a
            :class:`~lightning_bandlimit.strategies.SampleSchedule` (linear warmup over the first
            20 %, then cosine to 1 %) driven by samples seen, which stays on its curve when an
            elastic run changes its batch; it needs
            :class:`~lightning_bandlimit.strategies.ElasticDDPStrategy`, which advances it.

    Raises:
        TypeError: if a hyperparameter has the wrong type (a float ``num_classes``, a string ``momentum``).
        ValueError: for an unknown backbone or an out-of-range hyperparameter; at fit time for
            ``lr_schedule="samples"`` without ``ElasticDDPStrategy``.

    Example:
        >>> model = ImageClassifier("small_cnn", num_classes=10, width=8)
        >>> model(torch.rand(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(
        self,
        backbone: str = "cifar_resnet18",
        num_classes: int = 10,
        width: int | None = None,
        mean: Sequence[float] = CIFAR10_MEAN,
        std: Sequence[float] = CIFAR10_STD,
        learning_rate: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        label_smoothing: float = 0.0,
        lr_schedule: str = "onecycle",
    ) -> None:
        super().__init__()
        check_int("num_classes", num_classes, minimum=2)
        check_real("learning_rate", learning_rate, minimum=0, min_open=True)
        check_real("momentum", momentum, minimum=0, maximum=1, max_open=True)
        check_real("weight_decay", weight_decay, minimum=0)
        check_real("label_smoothing", label_smoothing, minimum=0, maximum=1, max_open=True)
        check_choice("lr_schedule", lr_schedule, ("onecycle", "samples"))
        self.save_hyperparameters()
        self.normalize = Normalize(mean, std)
        self.backbone = build_backbone(backbone, num_classes, width)
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(self.normalize(x))

    def _step(self, batch: Any, stage: str, metric: MulticlassAccuracy) -> torch.Tensor:
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)
        metric(logits, labels)
        on_step = stage == "train"
        # epoch-level validation/test losses are averaged over ranks (one all-reduce per epoch)
        self.log(
            f"{stage}/loss",
            loss,
            on_step=on_step,
            on_epoch=True,
            prog_bar=stage != "test",
            sync_dist=not on_step,
        )
        self.log(f"{stage}/acc", metric, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._step(batch, "train", self.train_acc)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "val", self.val_acc)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._step(batch, "test", self.test_acc)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(images).softmax(-1)

    def _sample_schedule(self, optimizer: torch.optim.Optimizer, total_steps: int) -> SampleSchedule:
        trainer = self.trainer
        if not advances_sample_schedules(trainer):
            raise ValueError(
                "lr_schedule='samples' is advanced by ElasticDDPStrategy (strategy='elastic_ddp'), got "
                f"{type(trainer.strategy).__name__}; use lr_schedule='onecycle' with other strategies"
            )
        loader = training_loader(trainer)
        if trainer.max_epochs is not None and trainer.max_epochs > 0:
            total = trainer.max_epochs * len(loader.dataset)
        else:
            total = total_steps * loader.batch_size * trainer.world_size * trainer.accumulate_grad_batches
        return SampleSchedule(
            optimizer, total_samples=total, warmup_samples=int(0.2 * total), min_lr_ratio=0.01
        )

    def configure_optimizers(self) -> Any:
        hp = self.hparams
        optimizer = torch.optim.SGD(
            self.parameters(),
            lr=hp.learning_rate,
            momentum=hp.momentum,
            weight_decay=hp.weight_decay,
            nesterov=hp.momentum > 0,
        )
        total_steps = max(1, int(self.trainer.estimated_stepping_batches))
        if hp.get("lr_schedule", "onecycle") == "samples":
            return {
                "optimizer": optimizer,
                "lr_scheduler": {
                    "scheduler": self._sample_schedule(optimizer, total_steps),
                    "interval": "step",
                },
            }
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=hp.learning_rate, total_steps=total_steps, pct_start=0.2
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
