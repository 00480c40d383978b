"""AdaptiveBandLimit's rung orders: the cheapest bytes first (the default), with pointwise modes.

The rungs come from the first step's profile (:meth:`UnitProfile.plan`); under a scripted squeeze
the job climbs them, runs units in their pointwise mode, stays exact (the same weights as the
same fit without pressure), and resumes with the same rungs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from _helpers import SCRIPTED_ADAPTIVE, cpu_trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_bandlimit.callbacks import AdaptiveBandLimit
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.recompute.plan import parse_move
from lightning_bandlimit.recompute.switch import checkpoint_mode

M = 1_000_000
TOTAL = 100 * M
PRESSURE = [80 * M] * 3 + [30 * M, 20_100_000] + [19_900_000] * 6 + [80 * M] * 20
EASY = [80 * M] * 40
BLOCKS = [f"backbone.{i}" for i in range(3, 11)]


def _callback(frees: list[int], **kwargs: Any) -> AdaptiveBandLimit:
    kwargs = {**SCRIPTED_ADAPTIVE, "rung_order": "pointwise", "levers": ("checkpoint",), **kwargs}
    return AdaptiveBandLimit(probe=ScriptedProbe(free=frees, total=TOTAL), **kwargs)


def _data() -> SyntheticImageDataModule:
    return SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16)


class _Modes(pl.Callback):
    """The checkpointing mode of every block as each training batch starts, by global step, and
    the adaptive callback's rungs when training ends (before its teardown lets them go)."""

    def __init__(self, adaptive: AdaptiveBandLimit) -> None:
        self.adaptive = adaptive
        self.modes: dict[int, dict[str, str | None]] = {}
        self.rungs: list[list[str]] = []
        self.modes_at: dict[int, dict[str, str]] = {}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self.modes[trainer.global_step] = {n: checkpoint_mode(pl_module.get_submodule(n)) for n in BLOCKS}

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        stages = self.adaptive._rungs.stages
        assert stages is not None and stages.stages is not None
        self.rungs = [list(rung) for rung in stages.stages]
        self.modes_at = {r: stages.modes_at(r) for r in range(len(self.rungs) + 1)}


def _fit(callback: AdaptiveBandLimit, tmp_path: Path, **kwargs: Any) -> tuple[ImageClassifier, _Modes]:
    pl.seed_everything(0)
    model, modes = ImageClassifier("cifar_resnet18", width=4), _Modes(callback)
    trainer = cpu_trainer([callback, modes], default_root_dir=tmp_path, limit_val_batches=0, **kwargs)
    trainer.fit(model, _data())
    return model, modes


def test_the_squeeze_climbs_the_cost_ordered_rungs_exactly(tmp_path: Path) -> None:
    callback = _callback(PRESSURE)
    model, modes = _fit(callback, tmp_path / "squeezed", max_steps=20)
    rungs = modes.rungs
    moves = [move for rung in rungs for move in rung]
    # every unit's full move once, and pointwise moves before their unit's full move
    assert sorted(m for m in moves if parse_move(m)[1] == "full") == sorted(BLOCKS)
    pointwise = [m for m in moves if parse_move(m)[1] == "pointwise"]
    assert pointwise
    assert all(moves.index(m) < moves.index(parse_move(m)[0]) for m in pointwise)
    assert callback.controller.rungs == len(rungs) <= 8
    # the ladder climbed, every step ran a rung's modes exactly, and it gave everything back
    top = max(d["rung"] for d in callback.decisions)
    assert top >= 1
    states = [{n: m for n, m in step.items() if m is not None} for step in modes.modes.values()]
    assert all(state in modes.modes_at.values() for state in states)
    assert modes.modes_at[top] in states
    visited = {d["rung"] for d in callback.decisions}  # the ladder may jump past some rungs
    if any("pointwise" in modes.modes_at[r].values() for r in visited):
        assert any("pointwise" in state.values() for state in states)
    assert callback.decisions[-1]["rung"] == 0
    assert set(modes.modes[max(modes.modes)].values()) == {None}
    # exact: the weights of the same fit without pressure
    plain, _ = _fit(_callback(EASY), tmp_path / "easy", max_steps=20)
    for (name, a), (_, b) in zip(model.state_dict().items(), plain.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_the_top_rung_is_every_unit_in_full(tmp_path: Path) -> None:
    callback = _callback([10 * M] * 8, levers=("checkpoint", "compression"))
    _, modes = _fit(callback, tmp_path, max_steps=6)
    assert callback.rung == callback.controller.top == len(modes.rungs)
    assert set(modes.modes[5].values()) == {"full"}


def test_the_stage_order_has_no_pointwise_moves(tmp_path: Path) -> None:
    callback = _callback(PRESSURE[:8], rung_order="stages")
    _, modes = _fit(callback, tmp_path, max_steps=6)
    assert modes.rungs == [BLOCKS[i : i + 2] for i in range(0, 8, 2)]


def test_the_cost_order_takes_units_in_full_a_few_per_rung(tmp_path: Path) -> None:
    callback = _callback(PRESSURE[:8], rung_order="cost")
    _, modes = _fit(callback, tmp_path, max_steps=6)
    moves = [m for rung in modes.rungs for m in rung]
    assert sorted(moves) == sorted(BLOCKS)  # full moves only, each unit once
    assert 4 < len(modes.rungs) <= 8  # finer than the 4 stages


def test_bad_rung_order() -> None:
    with pytest.raises(ValueError, match="rung_order"):
        AdaptiveBandLimit(rung_order="random")


def test_a_resumed_job_keeps_its_rungs_and_rung(tmp_path: Path, stop_after: type) -> None:
    callback = _callback(PRESSURE[:10])  # stops under pressure
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=10, save_top_k=0)
    pl.seed_everything(0)
    cpu_trainer(
        [callback, saver, stop_after(10)],
        default_root_dir=tmp_path,
        max_steps=14,
        limit_val_batches=0,
        enable_checkpointing=True,
    ).fit(ImageClassifier("cifar_resnet18", width=4), _data())
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["callbacks"]
    state = next(v for k, v in saved.items() if k.startswith("AdaptiveBandLimit"))
    assert state["rung"] > 0
    assert any(parse_move(m)[1] == "pointwise" for rung in state["stages"] for m in rung)
    resumed = _callback([30 * M] * 20)  # the hold band
    modes = _Modes(resumed)
    cpu_trainer([resumed, modes], default_root_dir=tmp_path, max_steps=14, limit_val_batches=0).fit(
        ImageClassifier("cifar_resnet18", width=4), _data(), ckpt_path=tmp_path / "ckpt" / "last.ckpt"
    )
    assert resumed.decisions[0]["rung"] == state["rung"]
    # no profiling step: the first resumed batch ran on the saved rung, in the saved modes
    assert modes.rungs == state["stages"]
    expected = modes.modes_at[state["rung"]]
    assert {n: m for n, m in modes.modes[10].items() if m is not None} == expected
