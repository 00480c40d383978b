"""ImageClassifier and backbones."""

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from _helpers import cpu_trainer

from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.models import ImageClassifier, build_backbone, cifar_resnet18


def test_normalisation_is_inside_the_model() -> None:
    model = ImageClassifier("small_cnn", width=4, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)).eval()
    x = torch.rand(2, 3, 32, 32)
    expected = model.backbone((x - 0.5) / 0.25)
    assert torch.allclose(model(x), expected)


def test_cifar_resnet18_shapes_and_parameter_count() -> None:
    model = cifar_resnet18(10)
    assert sum(p.numel() for p in model.parameters()) == 11_173_962  # the standard CIFAR ResNet-18
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert (
        sum(m.kernel_size == (3, 3) for m in convs) == 17 and sum(m.kernel_size == (1, 1) for m in convs) == 3
    )


def test_backbones_by_name() -> None:
    assert build_backbone("resnet18", 7)(torch.rand(1, 3, 64, 64)).shape == (1, 7)
    with pytest.raises(ValueError, match="unknown backbone 'nope'"):
        build_backbone("nope", 10)
    with pytest.raises(ValueError, match="width applies to"):
        build_backbone("resnet18", 10, width=8)


def test_argument_checks() -> None:
    with pytest.raises(ValueError, match="num_classes"):
        ImageClassifier(num_classes=1)
    with pytest.raises(ValueError, match="learning_rate"):
        ImageClassifier(learning_rate=0.0)


def test_trains_logs_metrics_and_uses_a_per_step_schedule(tmp_path: Path) -> None:
    model = ImageClassifier("small_cnn", width=4, learning_rate=0.05)
    trainer = cpu_trainer(default_root_dir=tmp_path, max_epochs=2)
    data = SyntheticImageDataModule(train_size=32, val_size=16, test_size=16, batch_size=8)
    trainer.fit(model, data)
    assert {"train/loss_epoch", "train/acc", "val/loss", "val/acc"} <= set(trainer.callback_metrics)
    scheduler = trainer.lr_scheduler_configs[0]
    assert scheduler.interval == "step" and scheduler.scheduler.total_steps == 8
    test = trainer.test(model, data, verbose=False)[0]
    assert 0.0 <= test["test/acc"] <= 1.0
    probs = trainer.predict(model, data)[0]
    assert torch.allclose(probs.sum(-1), torch.ones(len(probs)))


def test_sample_schedule_needs_the_elastic_strategy() -> None:

    from lightning_bandlimit.data import SyntheticImageDataModule

    with pytest.raises(ValueError, match="lr_schedule"):
        ImageClassifier("small_cnn", width=8, lr_schedule="cosine")
    trainer = pl.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.raises(ValueError, match="ElasticDDPStrategy"):
        trainer.fit(
            ImageClassifier("small_cnn", width=8, lr_schedule="samples"),
            SyntheticImageDataModule(train_size=16, batch_size=8),
        )
