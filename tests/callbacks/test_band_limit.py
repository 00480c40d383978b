"""BandLimit: swap in setup, state in checkpoints, logging, teardown, DDP."""

import warnings
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from _helpers import cpu_trainer, run_ddp_script
from torch import nn

from lightning_bandlimit import BandLimitedConv2d, bandlimited_layers
from lightning_bandlimit.callbacks import BandLimit
from lightning_bandlimit.callbacks.band_limit_checkpoint import (
    band_limit_states,
    bandlimit_as_saved,
    compression_from_checkpoint,
)
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.layers.lean import LeanBatchNorm2d, LeanMaxPool2d, LeanModule, LeanReLU
from lightning_bandlimit.models import ImageClassifier


def _trainer(tmp_path: Path, callbacks: list, **kwargs: object) -> pl.Trainer:
    return cpu_trainer(
        callbacks, **{"default_root_dir": tmp_path, "max_steps": 2, "limit_val_batches": 1, **kwargs}
    )


def _data() -> SyntheticImageDataModule:
    return SyntheticImageDataModule(train_size=32, val_size=16, test_size=16, batch_size=8)


def _model() -> ImageClassifier:
    return ImageClassifier("small_cnn", width=4)


def test_setup_swaps_the_convolutions_and_logs(tmp_path: Path) -> None:
    model = _model()
    assert not list(bandlimited_layers(model))
    callback = BandLimit(compression=0.4)
    trainer = _trainer(tmp_path, [callback], log_every_n_steps=1)
    trainer.fit(model, _data())
    names = [n for n, _ in bandlimited_layers(model)]
    assert names == ["backbone.0", "backbone.4", "backbone.8"]
    assert all(layer.compression == 0.4 for layer in callback.layers)
    assert trainer.callback_metrics["BandLimit/compression"] == pytest.approx(0.4)
    assert 0.3 < float(trainer.callback_metrics["BandLimit/achieved_compression"]) < 0.5
    model(torch.rand(1, 3, 32, 32))  # the model stays usable after teardown


def test_compression_setter_updates_layers(tmp_path: Path) -> None:
    model, callback = _model(), BandLimit(compression=0.2, exclude="backbone.8")
    _trainer(tmp_path, [callback]).fit(model, _data())
    callback.compression = 0.7
    assert [layer.compression for _, layer in bandlimited_layers(model)] == [0.7, 0.7]
    with pytest.raises(ValueError, match="compression"):
        callback.compression = 1.0


def test_resume_from_checkpoint_continues_with_saved_compression(tmp_path: Path, stop_after: type) -> None:
    model, callback = _model(), BandLimit(compression=0.3)
    trainer = _trainer(tmp_path, [callback, stop_after(2)], max_steps=4)
    trainer.fit(model, _data())
    assert trainer.global_step == 2
    callback.compression = 0.6  # e.g. moved by a controller during the run
    ckpt = tmp_path / "run.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=False)["callbacks"][callback.state_key]
    assert saved == {"compression": 0.6, "include": None, "exclude": None, "pointwise": False}

    resumed_model, resumed = _model(), BandLimit(compression=0.1)
    trainer = _trainer(tmp_path, [resumed], max_steps=4)
    trainer.fit(resumed_model, _data(), ckpt_path=ckpt)
    assert resumed.compression == 0.6
    assert {layer.compression for _, layer in bandlimited_layers(resumed_model)} == {0.6}
    assert trainer.global_step == 4


def test_plain_checkpoint_loads_into_a_band_limited_run(tmp_path: Path) -> None:
    plain = _model()
    trainer = _trainer(tmp_path, [])
    trainer.fit(plain, _data())
    ckpt = tmp_path / "plain.ckpt"
    trainer.save_checkpoint(ckpt)
    model, callback = _model(), BandLimit(compression=0.5)
    _trainer(tmp_path, [callback]).validate(model, _data(), ckpt_path=ckpt, verbose=False)
    assert isinstance(model.backbone[0], BandLimitedConv2d) and callback.compression == 0.5
    assert torch.equal(model.backbone[0].weight, plain.backbone[0].weight)


def test_band_limited_checkpoint_evaluates_with_and_without_band_limiting(tmp_path: Path) -> None:
    model = _model()
    trainer = _trainer(tmp_path, [BandLimit(compression=0.5)])
    trainer.fit(model, _data())
    ckpt = tmp_path / "bl.ckpt"
    trainer.save_checkpoint(ckpt)
    plain = _model()
    # the checkpoint holds BandLimit's state, which a run without the callback leaves unused
    # (Lightning warns about that in its own words; what matters here is the plain model)
    assert band_limit_states(torch.load(ckpt, map_location="cpu", weights_only=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        metrics = _trainer(tmp_path, []).validate(plain, _data(), ckpt_path=ckpt, verbose=False)
    assert type(plain.backbone[0]) is nn.Conv2d and "val/acc" in metrics[0]
    banded = _model()
    metrics = _trainer(tmp_path, [BandLimit(compression=0.1)]).validate(
        banded, _data(), ckpt_path=ckpt, verbose=False
    )
    assert banded.backbone[0].compression == 0.5  # restored from the checkpoint
    assert torch.equal(banded.backbone[0].weight, plain.backbone[0].weight)


def test_restore_on_teardown(tmp_path: Path) -> None:
    model = _model()
    types = {name: type(m) for name, m in model.named_modules()}
    _trainer(tmp_path, [BandLimit(compression=0.5, restore_on_teardown=True)]).fit(model, _data())
    assert not list(bandlimited_layers(model))
    assert {name: type(m) for name, m in model.named_modules()} == types  # BatchNorm, ReLU, pools too


def test_memory_lean_is_on_by_default_and_can_be_switched_off(tmp_path: Path) -> None:
    lean, plain = _model(), _model()
    _trainer(tmp_path, [BandLimit(compression=0.5)]).fit(lean, _data())
    _trainer(tmp_path, [BandLimit(compression=0.5, memory_lean=False)]).fit(plain, _data())
    assert {type(m) for m in lean.modules()} >= {LeanBatchNorm2d, LeanReLU, LeanMaxPool2d}
    assert all(layer.memory_lean for _, layer in bandlimited_layers(lean))
    assert not any(isinstance(m, LeanModule) for m in plain.modules())
    assert not any(layer.memory_lean for _, layer in bandlimited_layers(plain))


def test_warns_when_there_is_nothing_to_band_limit(tmp_path: Path) -> None:
    model = _model()
    with pytest.warns(UserWarning, match="found no convolution to band-limit"):
        _trainer(tmp_path, [BandLimit(include="nothing.*")]).fit(model, _data())


def test_argument_checks() -> None:
    with pytest.raises(ValueError, match="compression"):
        BandLimit(compression=1.0)
    with pytest.raises(TypeError, match="include must be"):
        BandLimit(include=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="restore_on_teardown must be a bool"):
        BandLimit(restore_on_teardown="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="memory_lean must be a bool"):
        BandLimit(memory_lean=None)  # type: ignore[arg-type]


def _ddp_run(tmp_path: Path, memory_lean: bool) -> list[dict]:
    out = tmp_path / f"lean{int(memory_lean)}"
    out.mkdir()
    return run_ddp_script(
        Path(__file__).with_name("ddp_band_limit_script.py"), out, BANDLIMIT_LEAN=str(int(memory_lean))
    )


@pytest.mark.slow
def test_every_ddp_rank_swaps_identically_and_memory_lean_trains_the_same(tmp_path: Path) -> None:
    reports = _ddp_run(tmp_path, memory_lean=True)
    assert reports[0]["world_size"] == reports[1]["world_size"] == 2
    assert reports[0]["layers"] == reports[1]["layers"] and len(reports[0]["layers"]) == 3
    assert reports[0]["lean"] == reports[1]["lean"] > 0
    assert reports[0]["weights"] == pytest.approx(reports[1]["weights"])  # DDP kept them in sync
    plain = _ddp_run(tmp_path, memory_lean=False)
    assert plain[0]["lean"] == 0
    assert reports[0]["weights"] == pytest.approx(plain[0]["weights"], rel=1e-4, abs=1e-6)


def test_checkpoint_readers_find_the_saved_band_limit(tmp_path: Path) -> None:
    from lightning_bandlimit.callbacks import AdaptiveBandLimit

    trainer = _trainer(tmp_path, [BandLimit(0.5, exclude="backbone.8")])
    trainer.fit(_model(), _data())
    trainer.save_checkpoint(tmp_path / "bl.ckpt")
    checkpoint = torch.load(tmp_path / "bl.ckpt", map_location="cpu", weights_only=True)
    states = band_limit_states(checkpoint)
    assert states == [{"compression": 0.5, "include": None, "exclude": ["backbone.8"], "pointwise": False}]
    assert compression_from_checkpoint(checkpoint) == 0.5
    plain = _model()
    bandlimit_as_saved(plain, states)
    assert type(plain.backbone[0]) is BandLimitedConv2d and type(plain.backbone[8]) is nn.Conv2d

    trainer = _trainer(tmp_path, [AdaptiveBandLimit(compression=0.3, min_compression=0.3)])
    trainer.fit(_model(), _data())
    trainer.save_checkpoint(tmp_path / "adaptive.ckpt")
    adaptive = torch.load(tmp_path / "adaptive.ckpt", map_location="cpu", weights_only=True)
    assert compression_from_checkpoint(adaptive) == 0.3
    assert compression_from_checkpoint({"callbacks": {}}) is None and band_limit_states({}) == []
