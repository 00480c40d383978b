"""AdaptiveBandLimit over the ladder: checkpointing rungs first, compression on the top rung."""

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from _helpers import SCRIPTED_ADAPTIVE, cpu_trainer, run_ddp_script
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_bandlimit import bandlimited_layers
from lightning_bandlimit.callbacks import AdaptiveBandLimit
from lightning_bandlimit.callbacks import adaptive_band_limit as adaptive_module
from lightning_bandlimit.checkpointing import is_checkpointed
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.memory.ladder import Setting
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.models.backbones import _BasicBlock

M = 1_000_000
TOTAL = 100 * M  # min_free 20 MB, release_free 40 MB (SCRIPTED_ADAPTIVE's fractions)
# The job (cifar_resnet18 width 4, batch 16) saves about 4.9 MB for backward at rung 0; its
# stages free about 1.57, 0.79, 0.39 and 0.20 MB. Free memory comes near min_free slowly (no
# surprise), then 0.1 MB under it: rung 1 is predicted to fit; on the next check free memory
# has not come back (the scripted co-tenant grew by what rung 1 freed), so the ladder climbs to
# the top rung and compression; then the co-tenant leaves.
PRESSURE = [80 * M] * 3 + [30 * M, 20_100_000] + [19_900_000] * 4 + [80 * M] * 20
BLOCKS = [f"backbone.{i}" for i in range(3, 11)]


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    # Tiny convolutions run far slower on two threads than on one when another process holds a
    # core; nothing here depends on it.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _data() -> SyntheticImageDataModule:
    return SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16)


def _callback(frees: list[int] = PRESSURE, **kwargs: Any) -> AdaptiveBandLimit:
    return AdaptiveBandLimit(probe=ScriptedProbe(free=frees, total=TOTAL), **{**SCRIPTED_ADAPTIVE, **kwargs})


def _model() -> ImageClassifier:
    return ImageClassifier("cifar_resnet18", width=4)


class _Spy(pl.Callback):
    """Records which blocks are checkpointed as each training batch starts, by global step."""

    def __init__(self) -> None:
        self.checkpointed: dict[int, int] = {}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self.checkpointed[trainer.global_step] = sum(
            is_checkpointed(pl_module.get_submodule(name)) for name in BLOCKS
        )


def _fit(callback: AdaptiveBandLimit, tmp_path: Path, max_steps: int = 20, model: Any = None, **kwargs: Any):
    model = _model() if model is None else model
    spy = _Spy()
    trainer = cpu_trainer(
        [callback, spy], default_root_dir=tmp_path, max_steps=max_steps, limit_val_batches=0, **kwargs
    )
    trainer.fit(model, _data())
    return model, spy, trainer


def _timeline(callback: AdaptiveBandLimit) -> list[tuple[int, int, float]]:
    return [(d["step"], d["rung"], d["compression"]) for d in callback.decisions]


def test_rungs_first_compression_on_the_top_rung_then_back(tmp_path: Path) -> None:
    callback = _callback()
    keys = list(_model().state_dict())
    model, spy, trainer = _fit(callback, tmp_path)
    timeline = _timeline(callback)
    assert [s for s, _, _ in timeline] == list(range(1, 21))  # a check every step
    assert timeline[:5] == [(s, 0, 0.0) for s in range(1, 6)]
    assert timeline[5] == (6, 1, 0.0)  # the first raise: one rung, exact
    assert callback.decisions[5]["reason"] == "raise"
    assert callback.decisions[5]["checkpointed_units"] == 2
    top = callback.controller.top
    assert top == 4
    # compression only ever above 0 on the top rung, and the rungs were climbed first
    lossy = [(s, r, c) for s, r, c in timeline if c > 0]
    assert lossy and all(r == top for _, r, c in lossy)
    first_lossy = timeline.index(lossy[0])
    assert all(c == 0 for _, _, c in timeline[:first_lossy])
    assert max(r for _, r, _ in timeline[:first_lossy]) >= 1
    # released: the compression first, then the rungs, back to the plain model
    assert timeline[-1][1:] == (0, 0.0)
    back = next(i for i in range(first_lossy, len(timeline)) if timeline[i][1] < top)
    assert timeline[back - 1] == (timeline[back - 1][0], top, 0.0)
    # records
    for record in callback.decisions:
        assert {"step", "rung", "checkpointed_units", "compression", "reason", "free_bytes"} <= set(record)
        assert {"job_peak_bytes", "slowdown"} <= set(record)
        assert record["checkpointed_units"] == 2 * record["rung"]  # 2 blocks a stage
        assert record["job_peak_bytes"] > 0
    assert callback.decisions[0]["slowdown"] == 1.0  # rung 0 over itself
    # the model ran at the decided rung: checkpointed blocks as each next step started
    for record in callback.decisions[:-1]:
        assert spy.checkpointed[record["step"]] == record["checkpointed_units"], record
    assert {layer.compression for _, layer in bandlimited_layers(model)} == {0.0}
    # learned: memory per rung (rung 0 measured, rung 1 too) and the stage savings
    ladder = callback.controller
    assert {0, 1} <= set(ladder.rung_memory.points)
    assert ladder.stage_savings is not None and len(ladder.stage_savings) == 4
    assert all(a > b > 0 for a, b in zip(ladder.stage_savings, ladder.stage_savings[1:]))
    assert ladder.rung_memory.points[1] < ladder.rung_memory.points[0]  # rung 1 measured leaner
    # teardown: the user's model as it was
    assert [type(model.get_submodule(n)) for n in BLOCKS] == [_BasicBlock] * 8
    assert not any(is_checkpointed(m) for m in model.modules())
    assert list(model.state_dict()) == keys
    assert callback.checkpointed_units == []
    assert {"AdaptiveBandLimit/rung", "AdaptiveBandLimit/checkpointed_units"} <= set(trainer.callback_metrics)


def test_setting_and_checkpointed_units_during_the_fit(tmp_path: Path) -> None:
    seen = []

    class Look(pl.Callback):
        def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
            seen.append((callback.setting, list(callback.checkpointed_units)))

    callback = _callback(PRESSURE[:7])
    cpu_trainer([callback, Look()], default_root_dir=tmp_path, max_steps=8, limit_val_batches=0).fit(
        _model(), _data()
    )
    assert seen[:6] == [(Setting(0, 0.0), [])] * 6
    # after step 6's check the ladder is on rung 1: the first stage's two blocks
    assert seen[6] == (Setting(1, 0.0), ["backbone.3", "backbone.4"])
    assert seen[7][0] == Setting(4, 0.3) and seen[7][1] == BLOCKS


def test_compression_lever_only_never_checkpoints(tmp_path: Path) -> None:
    callback = _callback(levers=["compression"])
    model, spy, _ = _fit(callback, tmp_path)
    assert callback.levers == ("compression",)
    assert {d["rung"] for d in callback.decisions} == {0}
    assert {d["checkpointed_units"] for d in callback.decisions} == {0}
    assert set(spy.checkpointed.values()) == {0}
    compressions = [d["compression"] for d in callback.decisions]
    assert compressions[5] > 0  # the first pressure check raises the compression, as before
    assert compressions[-1] == 0.0
    assert callback.controller.rungs == 0 and callback.controller.stage_savings is None


def test_checkpoint_lever_only_stays_exact(tmp_path: Path) -> None:
    callback = _callback(levers=["checkpoint"])
    model, spy, _ = _fit(callback, tmp_path)
    assert callback.levers == ("checkpoint",)
    assert {d["compression"] for d in callback.decisions} == {0.0}
    assert {layer.compression for _, layer in bandlimited_layers(model)} == {0.0}
    rungs = [d["rung"] for d in callback.decisions]
    assert rungs[5] == 1 and max(rungs) == 4  # climbed to the top, no further
    assert rungs[-1] == 0
    assert max(spy.checkpointed.values()) == 8


def test_levers_are_normalised_to_ladder_order() -> None:
    assert AdaptiveBandLimit(levers=["compression", "checkpoint"]).levers == ("checkpoint", "compression")
    assert AdaptiveBandLimit(levers=("checkpoint",)).controller.max_compression == 0.0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"levers": ["x"]}, ValueError),
        ({"levers": ["checkpoint", "x"]}, ValueError),
        ({"levers": []}, ValueError),
        ({"levers": "checkpoint"}, TypeError),
        ({"levers": None}, TypeError),
        ({"checkpoint_units": 5}, TypeError),
        ({"checkpoint_units": ["backbone.3", 5]}, TypeError),
        ({"max_slowdown": 0.5}, ValueError),
    ],
)
def test_bad_arguments(kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        AdaptiveBandLimit(**kwargs)


def test_checkpoint_units_matching_nothing_warn_once(tmp_path: Path) -> None:
    callback = _callback(checkpoint_units=["no.such.module*"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(callback, tmp_path, max_steps=8)
    matching = [w for w in caught if "matches no module" in str(w.message)]
    assert len(matching) == 1, [str(w.message) for w in caught]
    assert {d["rung"] for d in callback.decisions} == {0}  # no rungs: compression alone
    assert max(d["compression"] for d in callback.decisions) > 0


def test_checkpoint_units_patterns_choose_the_units(tmp_path: Path) -> None:
    callback = _callback(checkpoint_units=["backbone.[3-6]"])
    model, spy, _ = _fit(callback, tmp_path)
    assert callback.controller.top == 2  # two stages of two blocks
    assert max(spy.checkpointed.values()) == 4
    assert {d["rung"] for d in callback.decisions} <= {0, 1, 2}


class _Clock:
    """A fake ``time`` for the callback: each step takes 1 s plus 0.5 s per checkpointed stage."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _Tick(pl.Callback):
    def __init__(self, clock: _Clock, adaptive: AdaptiveBandLimit) -> None:
        self.clock, self.adaptive = clock, adaptive

    def on_train_batch_end(self, *args: Any) -> None:
        stages = self.adaptive._stages
        self.clock.now += 1.0 + 0.5 * (stages.rung if stages is not None else 0)


def test_max_slowdown_takes_slow_rungs_off_the_ladder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock()
    monkeypatch.setattr(adaptive_module, "time", clock)
    callback = _callback(max_slowdown=1.8)
    model = _model()
    trainer = cpu_trainer(
        [_Tick(clock, callback), callback], default_root_dir=tmp_path, max_steps=20, limit_val_batches=0
    )
    trainer.fit(model, _data())
    ladder = callback.controller
    assert ladder.slowdown(1) == pytest.approx(1.5)  # rung 1 ran at the floor compression: timed
    assert ladder.slowdown(4) == pytest.approx(3.0)  # rung 4 too, once its compression was released
    assert ladder.top == 3  # 3.0 > 1.8: rung 4 left the ladder
    timed = next(d["step"] for d in callback.decisions if d["rung"] == 4 and d["compression"] == 0)
    assert all(d["rung"] <= 3 for d in callback.decisions if d["step"] > timed + 1)
    assert any(d["slowdown"] == pytest.approx(3.0) for d in callback.decisions)
    assert callback.decisions[-1]["rung"] == 0


# -- out-of-memory backstop -------------------------------------------------------------------


class _FitsCheckpointed(ImageClassifier):
    """Simulates a job that runs out of memory unless its blocks are checkpointed: the error is
    raised at the start of ``training_step``, in the middle of the forward (before block
    ``backbone.5`` runs) or at its end."""

    def __init__(self, where: str) -> None:
        super().__init__("cifar_resnet18", width=4)
        self.where = where
        self.ooms = 0
        if where == "middle":
            self.backbone[5].register_forward_pre_hook(lambda *_: self._maybe_oom())

    def _maybe_oom(self) -> None:
        if self.training and torch.is_grad_enabled() and not is_checkpointed(self.backbone[3]):
            self.ooms += 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.where == "start":
            self._maybe_oom()
        loss = super().training_step(batch, batch_idx)
        if self.where == "end":
            self._maybe_oom()
        return loss


def _fit_oom(
    tmp_path: Path, where: str, max_steps: int = 4
) -> tuple[AdaptiveBandLimit, _FitsCheckpointed, _Spy]:
    model = _FitsCheckpointed(where)
    callback = _callback([30 * M] * 20)  # the hold band: nothing but the backstop moves
    try:
        with pytest.warns(UserWarning, match="out of memory in training_step"):
            _, spy, _ = _fit(callback, tmp_path, max_steps=max_steps, model=model)
    except torch.cuda.OutOfMemoryError:
        pytest.fail(
            f"the retry ran out of memory again, at {callback.decisions[-1]}; "
            f"ladder {callback.controller.state_dict()}"
        )
    return callback, model, spy


def test_oom_backstop_retries_on_the_top_rung_exactly(tmp_path: Path) -> None:
    callback, model, spy = _fit_oom(tmp_path, "end")
    assert model.ooms == 1
    first = callback.decisions[0]
    assert (first["step"], first["reason"], first["rung"], first["compression"]) == (0, "oom", 4, 0.0)
    assert first["checkpointed_units"] == 8
    assert callback.controller.oom_floor == 0.0  # an exact retry sets no compression floor
    assert {(d["rung"], d["compression"]) for d in callback.decisions} == {(4, 0.0)}
    assert spy.checkpointed[1] == 8
    assert "training_step" not in model.__dict__  # the guard is removed at teardown
    assert not any(is_checkpointed(m) for m in model.modules())


def test_oom_backstop_retry_does_not_learn_the_failed_attempt_as_the_retry_rung(tmp_path: Path) -> None:
    callback, _, _ = _fit_oom(tmp_path, "end")
    peaks = [d["job_peak_bytes"] for d in callback.decisions if d["reason"] == "hold"]
    # steps 1..4 all ran on rung 4 with the same batch size: the same bytes saved for backward
    assert len(set(peaks)) == 1, peaks


@pytest.mark.parametrize("where", ["start", "middle"])
def test_oom_in_the_first_step_keeps_the_whole_ladder(tmp_path: Path, where: str) -> None:
    # An out-of-memory error in the first step, which also measures the units, before all of
    # them ran: the retry should still go to the model's top rung, with every stage known.
    callback, model, spy = _fit_oom(tmp_path, where)
    assert model.ooms == 1
    assert callback.controller.rungs == callback.controller.top == 4, callback.controller.state_dict()
    first = callback.decisions[0]
    assert (first["reason"], first["rung"], first["compression"]) == ("oom", 4, 0.0), first
    assert spy.checkpointed[1] == 8


# -- resume -----------------------------------------------------------------------------------


def _fit_and_save(tmp_path: Path, stop_after: type) -> tuple[AdaptiveBandLimit, Path]:
    callback = _callback(PRESSURE[:10])  # stops under pressure: rung 4, compression > 0
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=10, save_top_k=0)
    cpu_trainer(
        [callback, saver, stop_after(10)],
        default_root_dir=tmp_path,
        max_steps=14,
        limit_val_batches=0,
        enable_checkpointing=True,
    ).fit(_model(), _data())
    assert callback.rung == 4 and callback.compression > 0
    return callback, tmp_path / "ckpt" / "last.ckpt"


def _resume(tmp_path: Path, ckpt: Path, frees: list[int]) -> tuple[AdaptiveBandLimit, _Spy, ImageClassifier]:
    resumed = _callback(frees)
    spy = _Spy()
    model = _model()
    cpu_trainer([resumed, spy], default_root_dir=tmp_path, max_steps=14, limit_val_batches=0).fit(
        model, _data(), ckpt_path=ckpt
    )
    return resumed, spy, model


def test_resume_restores_the_rung_and_the_compression(tmp_path: Path, stop_after: type) -> None:
    callback, ckpt = _fit_and_save(tmp_path, stop_after)
    resumed, spy, model = _resume(tmp_path, ckpt, [30 * M] * 10)  # the hold band: holds
    assert resumed.rung == callback.rung == 4
    assert resumed.compression == callback.compression
    assert [d["step"] for d in resumed.decisions] == [11, 12, 13, 14]
    assert {(d["rung"], d["compression"]) for d in resumed.decisions} == {(4, callback.compression)}
    assert spy.checkpointed[12] == 8  # applied to the model after the first resumed step
    assert {layer.compression for _, layer in bandlimited_layers(model)} == {callback.compression}
    assert resumed.controller.compression_memory.points == callback.controller.compression_memory.points


def test_resume_restores_what_the_ladder_learned_per_rung(tmp_path: Path, stop_after: type) -> None:
    callback, ckpt = _fit_and_save(tmp_path, stop_after)
    saved = torch.load(ckpt, weights_only=False)["callbacks"]
    state = next(v for k, v in saved.items() if k.startswith("AdaptiveBandLimit"))
    assert state["rung"] == 4
    assert state["controller"]["rung_memory"] == callback.controller.rung_memory.state_dict()
    resumed, _, _ = _resume(tmp_path, ckpt, [30 * M] * 10)
    ladder, before = resumed.controller, callback.controller
    assert ladder.rungs == ladder.top == 4
    # the memory measured per rung in the first run (no step of the resumed run ran at the floor
    # compression, so nothing was added or averaged in)
    assert ladder.rung_memory.points == before.rung_memory.points
    assert set(ladder.rung_seconds) == set(before.rung_seconds)


def test_resume_keeps_the_stage_savings_measured_at_the_floor_compression(
    tmp_path: Path, stop_after: type
) -> None:
    callback, ckpt = _fit_and_save(tmp_path, stop_after)
    resumed, _, _ = _resume(tmp_path, ckpt, [30 * M] * 10)
    # the bytes each stage frees at compression 0 (what the rungs' predictions use), not those
    # of the compressed model the resumed run starts with
    assert resumed.controller.stage_savings == pytest.approx(callback.controller.stage_savings, rel=0.01)


# -- DDP --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ddp_ranks_follow_the_same_ladder(tmp_path: Path) -> None:
    ranks = run_ddp_script(Path(__file__).with_name("ddp_ladder_script.py"), tmp_path)
    assert ranks[0]["timeline"] == ranks[1]["timeline"]
    timeline = ranks[0]["timeline"]
    assert len(timeline) == ranks[0]["steps"] == 16  # trained to the end on both ranks
    assert max(r for _, r, _ in timeline) >= 1  # rank 1's pressure moved both
    assert [r for _, r, c in timeline if c > 0] == [4] * sum(c > 0 for _, _, c in timeline)
    assert timeline[-1][1:] == [0, 0.0] or timeline[-1][1:] == (0, 0.0)
    assert ranks[0]["checkpointed"] == ranks[1]["checkpointed"]
    assert ranks[0]["layers"] == ranks[1]["layers"]
