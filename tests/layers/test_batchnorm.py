"""BatchNorm follows the compression: precise re-estimation, recent batches, the callbacks' use of them."""

import copy
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from _helpers import cpu_trainer
from torch import nn
from torch.optim.swa_utils import update_bn

from lightning_bandlimit.callbacks import AdaptiveBandLimit, BandLimit
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.layers.batchnorm import (
    RecentBatches,
    batchnorm_modules,
    default_forward,
    recalibrate_batchnorm,
)
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.models import ImageClassifier


def _net() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5))


def test_recalibration_is_the_average_of_batch_statistics_and_restores_the_module() -> None:
    net = _net().eval()
    net[1].momentum = 0.3
    batches = [torch.randn(8, 3, 6, 6) * (i + 1) + i for i in range(3)]
    with torch.no_grad():
        outs = [net[0](x) for x in batches]
    expected_mean = torch.stack([o.mean((0, 2, 3)) for o in outs]).mean(0)
    expected_var = torch.stack([o.var((0, 2, 3), unbiased=True) for o in outs]).mean(0)
    rng = torch.get_rng_state()
    assert recalibrate_batchnorm(net, batches) == 3
    torch.testing.assert_close(net[1].running_mean, expected_mean)
    torch.testing.assert_close(net[1].running_var, expected_var)
    assert net[1].momentum == 0.3 and not net.training and not net[1].training
    assert torch.equal(torch.get_rng_state(), rng)  # dropout ran in train mode on a forked stream


def test_recalibration_keeps_the_old_statistics_when_it_cannot_finish() -> None:
    net = _net()
    net[1].running_mean.fill_(2.0)
    with pytest.raises(ValueError, match="at least one batch"):
        recalibrate_batchnorm(net, [])
    assert torch.all(net[1].running_mean == 2.0) and net[1].momentum == 0.1

    def broken(model: nn.Module, batch: object) -> None:
        model(torch.randn(2, 3, 4, 4))
        raise RuntimeError("loader died")

    with pytest.raises(RuntimeError, match="loader died"):
        recalibrate_batchnorm(net, [None], forward=broken)
    assert torch.all(net[1].running_mean == 2.0) and net[1].momentum == 0.1
    assert recalibrate_batchnorm(nn.Linear(2, 2), [torch.randn(1, 2)]) == 0  # nothing to do


def test_default_forward_reads_tensors_and_tuples_and_says_what_it_expected() -> None:
    net = nn.Identity()
    x = torch.ones(2)
    assert default_forward(net, x) is x and default_forward(net, (x, 0)) is x
    with pytest.raises(TypeError, match=r"expected a tensor or a list/tuple.*got|type dict.*forward="):
        default_forward(net, {"image": x})


def test_recent_batches_keeps_the_last_ones_detached() -> None:
    recent = RecentBatches(2)
    w = torch.ones(1, requires_grad=True)
    for i in range(4):
        recent.append({"x": w * i, "i": i})
    got = list(recent.on(torch.device("cpu")))
    assert [b["i"] for b in got] == [2, 3] and not got[0]["x"].requires_grad
    with pytest.raises(ValueError, match="size must be >= 1, got 0"):
        RecentBatches(0)


def test_callback_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="recalibrate_bn.*-1"):
        BandLimit(recalibrate_bn=-1)
    with pytest.raises(TypeError, match="bn_forward must be callable"):
        AdaptiveBandLimit(bn_forward="forward")


class _SwitchAfter(pl.Callback):
    """Move the compression after the last training step, as AdaptiveBandLimit does on a release."""

    def __init__(self, band: BandLimit, to: float, step: int) -> None:
        self.band, self.to, self.step = band, to, step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step == self.step:
            self.band.compression = self.to


def _train_at_075_then_validate_at_0(tmp_path: Path, recalibrate_bn: int) -> tuple[float, float, BandLimit]:
    pl.seed_everything(0, verbose=False)
    data = SyntheticImageDataModule(train_size=1024, val_size=500, test_size=8, batch_size=64)
    model = ImageClassifier("small_cnn", width=8, learning_rate=0.05)
    band = BandLimit(0.75, recalibrate_bn=recalibrate_bn)
    steps = 3 * 1024 // 64
    trainer = cpu_trainer(
        default_root_dir=tmp_path,
        max_epochs=3,
        check_val_every_n_epoch=3,
        num_sanity_val_steps=0,
        callbacks=[band, _SwitchAfter(band, 0.0, steps)],
    )
    trainer.fit(model, data)
    validated = float(trainer.callback_metrics["val/acc"])
    reference = copy.deepcopy(model)
    update_bn(data.train_dataloader(), reference)  # population statistics over the whole training set
    reference.eval()
    with torch.no_grad():
        hits = [(reference(x).argmax(1) == y).float() for x, y in data.val_dataloader()]
    return validated, float(torch.cat(hits).mean()), band


@pytest.mark.slow  # trains twice, 48 steps each
def test_trained_at_075_evaluated_at_0_drops_without_recalibration_and_recovers_with_it(
    tmp_path: Path,
) -> None:
    stale, reestimated, _ = _train_at_075_then_validate_at_0(tmp_path, recalibrate_bn=0)
    assert stale < reestimated - 0.05  # the drop: running statistics of c = 0.75 used at c = 0
    followed, reestimated_too, band = _train_at_075_then_validate_at_0(tmp_path, recalibrate_bn=8)
    assert reestimated_too == pytest.approx(reestimated, abs=0.01)
    assert followed >= reestimated - 0.02  # 8 recent batches do what the whole training set does
    assert band.bn_recalibrations == 1 and band.bn_recalibration_seconds > 0


def test_adaptive_callback_changes_mark_statistics_stale_and_training_end_reestimates_once(
    tmp_path: Path,
) -> None:
    total = 2**40  # bytes: the learned memory model sees the job's real bytes
    probe = ScriptedProbe(free=[f * total // 10 for f in (9, 0, 9, 9, 9, 9, 9, 9)], total=total)
    band = AdaptiveBandLimit(
        probe=probe,
        min_free=0.2,
        release_free=0.5,
        check_every_n_steps=1,
        release_checks=1,
        cooldown_checks=0,
        recalibrate_bn=2,
        levers=["compression"],  # the compression's changes are what this test is about
    )
    recent: list[object] = []

    class Spy(pl.Callback):
        def on_train_batch_end(
            self, trainer: pl.Trainer, module: pl.LightningModule, outputs: object, batch: object, i: int
        ) -> None:
            recent[:] = [*recent[-1:], copy.deepcopy(batch)]

    model = ImageClassifier("small_cnn", width=4)
    trainer = cpu_trainer(
        default_root_dir=tmp_path, max_steps=6, limit_val_batches=0, callbacks=[band, Spy()]
    )
    trainer.fit(model, SyntheticImageDataModule(train_size=64, val_size=8, batch_size=8))
    changes = sum(a["compression"] != b["compression"] for a, b in zip(band.decisions, band.decisions[1:]))
    changes += band.decisions[0]["compression"] != 0.0
    # Training normalises with batch statistics: changes only mark the running ones stale, and
    # they are re-estimated once, when training ends, at the final compression.
    assert changes >= 2 and band.bn_recalibrations == 1
    reference = copy.deepcopy(model)
    recalibrate_batchnorm(reference, recent)  # the last two batches at the final compression
    for ours, theirs in zip(batchnorm_modules(model), batchnorm_modules(reference)):
        torch.testing.assert_close(ours.running_mean, theirs.running_mean)
        torch.testing.assert_close(ours.running_var, theirs.running_var)


def test_a_module_without_forward_gets_one_warning_and_trains(tmp_path: Path) -> None:
    class NoForward(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(10)
            )

        def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    band = BandLimit(0.5)
    trainer = cpu_trainer(default_root_dir=tmp_path, max_steps=2, limit_val_batches=0, callbacks=[band])
    with pytest.warns(UserWarning, match="defines no forward"):
        trainer.fit(NoForward(), SyntheticImageDataModule(train_size=16, val_size=8, batch_size=8))
    band.compression = 0.25  # nothing to re-estimate with: no error
    assert band.bn_recalibrations == 0


def _fit_small(tmp_path: Path, callbacks: list[pl.Callback], epochs: int = 1) -> ImageClassifier:
    pl.seed_everything(0, verbose=False)
    model = ImageClassifier("small_cnn", width=4)
    trainer = cpu_trainer(
        default_root_dir=tmp_path, max_epochs=epochs, num_sanity_val_steps=0, callbacks=callbacks
    )
    trainer.fit(model, SyntheticImageDataModule(train_size=64, val_size=16, batch_size=8))
    return model


def test_at_compression_0_the_running_statistics_stay_the_plain_models(tmp_path: Path) -> None:
    """Compression 0 throughout: the model is the plain one, so nothing is re-estimated (a
    re-estimate would replace the running averages the plain job keeps)."""
    plain = _fit_small(tmp_path / "plain", [])
    band = BandLimit(0.0, recalibrate_bn=4)
    ours = _fit_small(tmp_path / "ours", [band])
    assert band.bn_recalibrations == 0
    for a, b in zip(batchnorm_modules(plain), batchnorm_modules(ours), strict=True):
        torch.testing.assert_close(a.running_mean, b.running_mean, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a.running_var, b.running_var, rtol=1e-4, atol=1e-5)


def test_a_compressed_stretch_is_reestimated_once_then_compression_0_needs_nothing(tmp_path: Path) -> None:
    band = BandLimit(0.0, recalibrate_bn=2)
    up, down = _SwitchAfter(band, 0.5, 2), _SwitchAfter(band, 0.0, 4)
    _fit_small(tmp_path, [band, up, down], epochs=2)  # 8 steps per epoch, validation after each
    assert band.compression == 0.0
    assert band.bn_recalibrations == 1  # before the first validation; the second epoch ran at 0


@pytest.mark.parametrize(
    ("trainer_kwargs", "events"),
    [
        ({"max_epochs": 2}, {7, 15}),  # validation at each epoch's end (8 batches an epoch)
        ({"max_epochs": 1, "val_check_interval": 3}, {2, 5, 7}),  # every 3 batches, and the end
        ({"max_steps": 6, "limit_val_batches": 0}, {5}),  # no validation: the end of training
    ],
)
def test_on_cpu_only_the_batches_a_reestimate_reads_are_kept(
    tmp_path: Path, trainer_kwargs: dict, events: set[int]
) -> None:
    """The kept batches are the job's own memory on a CPU: a batch is kept only when it is
    among the last ``recalibrate_bn`` before a validation, the epoch's end or training's end."""
    band = BandLimit(0.5, recalibrate_bn=2)
    kept: list[int] = []
    seen: list[object] = []

    class Spy(pl.Callback):
        def on_train_start(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            assert band._recent is not None
            append = band._recent.append
            band._recent.append = lambda batch: (kept.append(len(seen)), append(batch))  # type: ignore[method-assign]

        def on_train_batch_end(
            self, trainer: pl.Trainer, module: pl.LightningModule, outputs: object, batch: object, i: int
        ) -> None:
            seen.append(copy.deepcopy(batch))

    model = ImageClassifier("small_cnn", width=4)
    trainer = cpu_trainer(
        default_root_dir=tmp_path, num_sanity_val_steps=0, callbacks=[band, Spy()], **trainer_kwargs
    )
    trainer.fit(model, SyntheticImageDataModule(train_size=64, val_size=8, batch_size=8))
    per_epoch = 8
    wanted = [i for i in range(len(seen)) if min(e - i % per_epoch for e in events if e >= i % per_epoch) < 2]
    assert kept == wanted
    # a re-estimate reads the last two batches of training
    band.compression = 0.25  # stale again: re-estimate by hand
    reference = copy.deepcopy(model)
    recalibrate_batchnorm(reference, seen[-2:])
    band._recalibrate_bn(trainer, model)
    for ours, theirs in zip(batchnorm_modules(model), batchnorm_modules(reference)):
        torch.testing.assert_close(ours.running_mean, theirs.running_mean)
