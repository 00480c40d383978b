"""AdaptiveBandLimit's micro-batch lever in a Trainer (issue 56): past the top rung the batch runs
in chunks before any compression, the split is kept in checkpoints and given back, and a step
that is not exact split leaves the lever off with one message. A resumed job (issue 68) keeps
the trial's outcome: it does not try again, and a restored split the outcome does not allow is
clamped with one warning. The test model has BatchNorm: its splits are ghost-batch splits (issue
69), which these tests of the lever's mechanics allow down to chunks of 2 samples
(``ghost_batch=2``, as a user asks for them); with the default (32) a batch of 16 has none."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from _helpers import cpu_trainer
from torch import nn

from lightning_bandlimit.callbacks import AdaptiveBandLimit, ladder_splits
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import MemoryReading
from lightning_bandlimit.memory.protocol import MemoryProbe
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.recompute.switch import is_checkpointed

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
        **{"ghost_batch": 2, **kwargs},
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
    assert caplog.text.count("micro-batch splits [2, 4, 8] on the top rung, ghost batches of at least 2") == 1
    assert "split 1 -> 2 (the batch in 2 chunks, ghost batches: approximate)" in caplog.text
    # BatchNorm normalises each chunk by its own statistics: the split steps are ghost, not exact
    assert {d["exactness"] for d in callback.decisions if d["split"] > 1} == {"ghost"}
    assert {d["exactness"] for d in callback.decisions if d["split"] == 1} == {"exact"}


def test_by_default_ghost_batches_below_32_samples_leave_the_lever_off_and_the_squeeze_compresses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    probe = _DeepSqueeze()
    callback = _callback(probe, ghost_batch=32)  # the default
    probe.callback = callback
    with caplog.at_level("INFO"):
        _fit(callback, 16, tmp_path)
    assert callback._splits is not None and callback._splits.outcome is not None
    assert callback._splits.outcome.ghost and callback._splits.outcome.splits == ()
    assert callback.controller.splits == () and all(d["split"] == 1 for d in callback.decisions)
    assert max(d["compression"] for d in callback.decisions) > 0
    assert {d["exactness"] for d in callback.decisions if d["compression"] > 0} == {"lossy"}
    said = [line for line in caplog.text.splitlines() if "micro-batch lever is off" in line]
    assert len(said) == 1 and "ghost_batch=32" in said[0] and "a batch of 16" in said[0], said


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


class _Chunks(ImageClassifier):
    """Counts the ``training_step`` calls of each training batch: its chunks (and the split
    trial's calls, had it run again after the batch)."""

    def on_train_start(self) -> None:
        self.chunks: list[int] = []
        self.checkpointed: list[int] = []  # units checkpointed as each training batch starts

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.chunks.append(0)
        self.checkpointed.append(sum(is_checkpointed(m) for m in self.modules()))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.chunks[-1] += 1
        return super().training_step(batch, batch_idx)


def _resume(path: Path, probe: _DeepSqueeze, tmp_path: Path) -> tuple[AdaptiveBandLimit, _Chunks]:
    """A fresh callback and a fresh model resumed from ``path``, as a user resumes a job."""
    resumed = _callback(probe)
    probe.callback = resumed
    model = _Chunks("cifar_resnet18", width=4)
    trainer = cpu_trainer([resumed], default_root_dir=tmp_path, max_steps=18, limit_val_batches=0)
    trainer.fit(
        model,
        SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16),
        ckpt_path=path,
    )
    return resumed, model


def test_a_split_job_resumes_at_its_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    probe = _DeepSqueeze(until=10_000)
    callback = _callback(probe)
    probe.callback = callback
    trainer = _fit(callback, 18, tmp_path, callbacks=[callback, _StopAt(14)])
    assert trainer.global_step == 14 and callback.split == 2
    path = tmp_path / "split.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)
    key, saved = next((k, v) for k, v in checkpoint["callbacks"].items() if k.startswith("AdaptiveBandLimit"))
    assert saved["split"] == 2 and saved["controller"]["splits"] == [2, 4, 8]
    # the trial's outcome (BatchNorm: chunks of at least 2 samples) is in the checkpoint
    assert saved["split_trial"] == {
        "tried": True,
        "splits": [2, 4, 8],
        "min_chunk": 2,
        "reason": None,
        "ghost": True,
    }

    def no_second_trial(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the split trial ran again on a resumed job")

    monkeypatch.setattr(ladder_splits, "split_trial", no_second_trial)
    resumed_probe = _DeepSqueeze(until=10_000)
    resumed_probe.checks = probe.checks
    caplog.clear()
    with caplog.at_level("INFO"):
        resumed, model = _resume(path, resumed_probe, tmp_path)
    assert [d["split"] for d in resumed.decisions] == [2] * len(resumed.decisions)
    assert resumed.controller.split_memory.points.keys() == callback.controller.split_memory.points.keys()
    assert not resumed_probe.over
    assert resumed._splits is not None and resumed._splits.outcome == callback._splits.outcome  # type: ignore[union-attr]
    assert resumed.controller.splits == (2, 4, 8)  # the lever stays on
    assert model.chunks == [2, 2, 2, 2]  # every step split in 2 from the first, no trial after it
    assert "micro-batch splits" not in caplog.text

    # Edited by hand: split 8 where the outcome allows only 2 and 4: split 4, said once.
    saved["split"], saved["split_trial"]["splits"] = 8, [2, 4]
    edited = tmp_path / "edited.ckpt"
    torch.save({**checkpoint, "callbacks": {**checkpoint["callbacks"], key: saved}}, edited)
    edited_probe = _DeepSqueeze(until=10_000)
    edited_probe.checks = probe.checks
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clamped, model = _resume(edited, edited_probe, tmp_path)
    said = [
        str(w.message) for w in caught if "not one the micro-batch lever's trial allows" in str(w.message)
    ]
    assert len(said) == 1 and "split 8" in said[0] and "running at split 4" in said[0], said
    assert model.chunks[0] == 4  # the first step ran at the clamped split
    assert clamped.controller.splits == (2, 4)  # the ladder climbs only the splits the outcome allows
    assert all(d["split"] in (1, 2, 4) for d in clamped.decisions)


class _StateAtEnd(pl.Callback):
    """The adaptive callback's saved state as training ends (before its teardown)."""

    def __init__(self, adaptive: AdaptiveBandLimit) -> None:
        self.adaptive = adaptive
        self.state: dict[str, Any] | None = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.state = self.adaptive.state_dict()


def test_a_checkpoint_saved_after_fit_resumes_as_one_saved_during_it(tmp_path: Path) -> None:
    # issue 68: the fit's end releases the units (the user's model as it was), not the stages
    # measured: a checkpoint saved after ``fit`` returns keeps them, and a fresh model resumed
    # from it runs the saved rung and split from its first step, without measuring again
    probe = _DeepSqueeze(until=10_000)
    callback = _callback(probe)
    probe.callback = callback
    during = _StateAtEnd(callback)
    trainer = _fit(callback, 18, tmp_path, callbacks=[callback, during, _StopAt(14)])
    assert callback.setting.rung == 4 and callback.split == 2
    path = tmp_path / "after_fit.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)
    saved = next(v for k, v in checkpoint["callbacks"].items() if k.startswith("AdaptiveBandLimit"))
    assert during.state is not None and during.state["stages"] is not None
    assert saved == during.state  # the stages too: the same as a checkpoint saved during the fit
    resumed_probe = _DeepSqueeze(until=10_000)
    resumed_probe.checks = probe.checks
    resumed, model = _resume(path, resumed_probe, tmp_path)
    assert model.checkpointed == [8, 8, 8, 8]  # rung 4 (two blocks a stage) from the first step
    assert model.chunks == [2, 2, 2, 2]  # at split 2, on that rung
    assert {(d["rung"], d["split"]) for d in resumed.decisions} == {(4, 2)}
    assert resumed.state_dict()["stages"] == saved["stages"]  # restored, not measured again


@pytest.mark.parametrize(
    ("split", "trial", "expected"),
    [
        (
            4,
            {"tried": True, "splits": [2, 4, 8], "min_chunk": 1, "reason": None, "ghost": False},
            4,
        ),  # allowed
        (
            8,
            {"tried": True, "splits": [2, 4], "min_chunk": 1, "reason": None, "ghost": False},
            4,
        ),  # largest below
        (
            2,
            {"tried": True, "splits": [], "min_chunk": 1, "reason": "a summed loss", "ghost": False},
            1,
        ),  # off
        # judged before training mode was (no ghost flag): tried again, the split kept until then
        (8, {"tried": True, "splits": [2, 4], "min_chunk": 2, "reason": None}, 8),
        (4, {"tried": False}, 4),  # not tried: kept, the trial runs on the first batch
        (4, None, 4),  # an older checkpoint: as before, the trial runs again
    ],
)
def test_a_restored_split_is_reconciled_with_the_restored_trial(
    split: int, trial: dict[str, Any] | None, expected: int
) -> None:
    callback = AdaptiveBandLimit(max_split=8)
    state = {"compression": 0.0, "rung": 0, "split": split, "stages": None, "controller": {}}
    if trial is not None:
        state["split_trial"] = trial
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        callback.load_state_dict(state)
    said = [str(w.message) for w in caught if "micro-batch lever's trial allows" in str(w.message)]
    assert callback.split == expected
    assert len(said) == (expected != split), said
    assert callback._splits is not None
    assert callback._splits.tried == bool(trial and trial["tried"] and "ghost" in trial)
    if trial is not None and trial["tried"] and not trial["splits"]:
        assert "a summed loss" in said[0]


def test_a_restored_trial_keeps_the_splits_up_to_max_split() -> None:
    callback = AdaptiveBandLimit(max_split=4)
    trial = {"tried": True, "splits": [2, 4, 8], "min_chunk": 2, "reason": None, "ghost": True}
    callback.load_state_dict({"split": 8, "split_trial": trial, "controller": {}})
    assert callback._splits is not None and callback._splits.outcome is not None
    assert callback._splits.outcome.splits == (2, 4) and callback.split == 4
    assert callback._splits.step.min_chunk == 2
    assert callback.state_dict()["split_trial"] == {**trial, "splits": [2, 4]}


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
