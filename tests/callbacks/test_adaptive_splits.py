"""AdaptiveBandLimit's micro-batch lever in a Trainer (issue 56): past the top rung the batch runs
in chunks before any compression, the split is kept in checkpoints and given back, and a step
that is not exact split leaves the lever off with one message."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from _helpers import cpu_trainer
from torch import nn

from lightning_bandlimit.callbacks import AdaptiveBandLimit
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import MemoryReading
from lightning_bandlimit.memory.protocol import MemoryProbe
from lightning_bandlimit.models import ImageClassifier

M = 1_000_000
TOTAL = 100 * M
BASE = 80 * M
# the step's increment per rung (cifar_resnet18 width 4, batch 16), and on the top rung per split:
# 1 MB that does not shrink with the chunk (gradients) and 2 MB of activations that do
RUNGS = [5.0 * M, 3.9 * M, 3.4 * M, 3.15 * M, 3.0 * M]

pytestmark = pytest.mark.usefixtures("one_thread")


class _DeepSqueeze(MemoryProbe):
    """A co-tenant of 12 MB that grows to 17.2 MB from the 8th check to the 30th: 2.2 MB more than
    the top rung frees; split 2 (1.5 MB less than the top rung) and the rungs fit it."""

    source = "scripted"
    measures_own = True

    def __init__(self, until: int = 30) -> None:
        self.callback: AdaptiveBandLimit | None = None
        self.checks = 0
        self.until = until
        self.over: list[int] = []

    def read(self) -> MemoryReading:
        assert self.callback is not None
        self.checks += 1
        rung, split = self.callback.rung, self.callback.split
        increment = RUNGS[rung] if split == 1 else 1.0 * M + 2.0 * M / split
        own = int(BASE + increment)
        cotenant = 17.2 * M if 8 <= self.checks < self.until else 12 * M
        free = int(TOTAL - own - cotenant)
        if free < 0:
            self.over.append(self.checks)
        return MemoryReading(TOTAL, max(0, free), self.source, own=own, own_base=BASE)


def _fit(callback: AdaptiveBandLimit, steps: int, tmp_path: Path, **kwargs: Any) -> Any:
    callbacks = kwargs.pop("callbacks", [callback])
    trainer = cpu_trainer(
        callbacks, default_root_dir=tmp_path, max_steps=steps, limit_val_batches=0, **kwargs
    )
    trainer.fit(
        ImageClassifier("cifar_resnet18", width=4),
        SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16),
    )
    return trainer


def _callback(probe: MemoryProbe, **kwargs: Any) -> AdaptiveBandLimit:
    return AdaptiveBandLimit(
        probe=probe,
        min_free=0.6 * M,
        release_free=3 * M,
        check_every_n_steps=1,
        continuum_rung="zero",
        rung_order="stages",
        **kwargs,
    )


def test_past_the_top_rung_the_batch_is_split_before_any_compression_and_given_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    probe = _DeepSqueeze()
    callback = _callback(probe)
    probe.callback = callback
    with caplog.at_level("INFO"):
        trainer = _fit(callback, 40, tmp_path)
    splits = [d["split"] for d in callback.decisions]
    assert callback.controller.splits == (2, 4, 8)
    assert max(splits) == 2 and all(d["compression"] == 0.0 for d in callback.decisions)
    assert all(d["rung"] == 4 for d in callback.decisions if d["split"] > 1)  # on the top rung
    assert probe.over and max(probe.over) <= 11  # the climb's checks only, then it fits
    assert callback.decisions[-1]["rung"] == 0 and callback.decisions[-1]["split"] == 1  # given back
    assert "AdaptiveBandLimit/split" in trainer.callback_metrics
    assert caplog.text.count("micro-batch splits [2, 4, 8] on the top rung") == 1
    assert "split 1 -> 2 (the batch in 2 chunks)" in caplog.text


def test_without_the_lever_the_same_squeeze_compresses(tmp_path: Path) -> None:
    probe = _DeepSqueeze()
    callback = _callback(probe, levers=["checkpoint", "compression"])
    probe.callback = callback
    _fit(callback, 16, tmp_path)
    assert callback.controller.splits == ()
    assert max(d["compression"] for d in callback.decisions) > 0  # the contrast: the lever is what saves it
    assert all(d["split"] == 1 for d in callback.decisions)


class _StopAt(pl.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        trainer.should_stop = trainer.global_step >= self.step


def test_a_split_job_resumes_at_its_split(tmp_path: Path) -> None:
    probe = _DeepSqueeze(until=10_000)
    callback = _callback(probe)
    probe.callback = callback
    trainer = _fit(callback, 18, tmp_path, callbacks=[callback, _StopAt(14)])
    assert trainer.global_step == 14 and callback.split == 2
    path = tmp_path / "split.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=False)["callbacks"]
    saved = next(v for k, v in state.items() if k.startswith("AdaptiveBandLimit"))
    assert saved["split"] == 2 and saved["controller"]["splits"] == [2, 4, 8]
    resumed_probe = _DeepSqueeze(until=10_000)
    resumed_probe.checks = probe.checks
    resumed = _callback(resumed_probe)
    resumed_probe.callback = resumed
    trainer = cpu_trainer([resumed], default_root_dir=tmp_path, max_steps=18, limit_val_batches=0)
    trainer.fit(
        ImageClassifier("cifar_resnet18", width=4),
        SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16),
        ckpt_path=path,
    )
    assert [d["split"] for d in resumed.decisions] == [2] * len(resumed.decisions)
    assert resumed.controller.split_memory.points.keys() == callback.controller.split_memory.points.keys()
    assert not resumed_probe.over


class _SummedLoss(ImageClassifier):
    """A loss summed over the batch: its split gradient is not the whole batch's."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        return nn.functional.cross_entropy(self(images), labels, reduction="sum")


def test_a_summed_loss_leaves_the_lever_off_with_one_message(tmp_path: Path) -> None:
    probe = _DeepSqueeze()
    callback = _callback(probe)
    probe.callback = callback
    trainer = cpu_trainer([callback], default_root_dir=tmp_path, max_steps=12, limit_val_batches=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(
            _SummedLoss("cifar_resnet18", width=4),
            SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16),
        )
    assert callback.controller.splits == ()
    assert all(d["split"] == 1 for d in callback.decisions)
    said = [str(w.message) for w in caught if "micro-batch lever leaves the ladder" in str(w.message)]
    assert len(said) == 1 and "summed" in said[0], said
