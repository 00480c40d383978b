"""AdaptiveBandLimit over the ladder: checkpointing rungs first, then compression on rung 0.

These tests pin the continuum on rung 0 (``continuum_rung="zero"``, as for models whose blocks
cannot keep a kept spectrum); ``test_adaptive_ladder_on_top.py`` covers the continuum on the
top rung that band-limited basic blocks get by default.
"""

import warnings
from collections.abc import Callable
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
from lightning_bandlimit.callbacks.ladder_reading import JobMemory
from lightning_bandlimit.callbacks.ladder_stages import ExactRungs
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.ladder import Setting
from lightning_bandlimit.memory import MemoryReading, ScriptedProbe
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.models.backbones import _BasicBlock
from lightning_bandlimit.recompute.switch import is_checkpointed

M = 1_000_000
TOTAL = 100 * M  # min_free 20 MB, release_free 40 MB (SCRIPTED_ADAPTIVE's fractions)
# The job (cifar_resnet18 width 4, batch 16) saves about 4.9 MB for backward at rung 0; its
# stages keep about 1.57, 0.79, 0.39 and 0.20 MB. Free memory comes near min_free slowly, then
# 0.1 MB under it for six checks: the stages' bytes hint that rung 1 is enough; on each next
# check free memory has not come back (the scripted co-tenant grew by what the rung freed, which
# the job did not predict: no surprise, but others' growth), so the ladder climbs to rung 2 and,
# others having grown over two checks (a ramp expected to go on), past rung 3 to the top; the
# top rung measured short, with nothing known of the continuum yet, it goes to
# max_compression (0.9) on rung 0; then the co-tenant leaves and the compression is given back
# straight to rung 0 (predicted to fit).
PRESSURE = [80 * M] * 3 + [30 * M, 20_100_000] + [19_900_000] * 6 + [80 * M] * 20
HOLD = [30 * M] * 20  # the hold band: nothing but the backstop moves
BLOCKS = [f"backbone.{i}" for i in range(3, 11)]
STAGES = [BLOCKS[i : i + 2] for i in range(0, 8, 2)]


pytestmark = pytest.mark.usefixtures("one_thread")


def _data() -> SyntheticImageDataModule:
    return SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16)


def _callback(frees: list[int] = PRESSURE, **kwargs: Any) -> AdaptiveBandLimit:
    # the rungs and the continuum; with the micro-batch lever between them: test_adaptive_splits.py
    kwargs = {
        **SCRIPTED_ADAPTIVE,
        "continuum_rung": "zero",
        "levers": ("checkpoint", "compression"),
        "rung_order": "stages",
        **kwargs,
    }
    return AdaptiveBandLimit(probe=ScriptedProbe(free=frees, total=TOTAL), **kwargs)


def _model() -> ImageClassifier:
    return ImageClassifier("cifar_resnet18", width=4)


class _Spy(pl.Callback):
    """Records which blocks are checkpointed as each training batch starts, by global step, and
    the adaptive callback's saved state when training ends (before its teardown)."""

    def __init__(self, adaptive: AdaptiveBandLimit | None = None) -> None:
        self.checkpointed: dict[int, int] = {}
        self.adaptive = adaptive
        self.final_state: dict[str, Any] | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self.checkpointed[trainer.global_step] = sum(
            is_checkpointed(pl_module.get_submodule(name)) for name in BLOCKS
        )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.adaptive is not None:
            self.final_state = self.adaptive.state_dict()


def _fit(callback: AdaptiveBandLimit, tmp_path: Path, max_steps: int = 20, model: Any = None, **kwargs: Any):
    model = _model() if model is None else model
    spy = _Spy(callback)
    trainer = cpu_trainer(
        [callback, spy], default_root_dir=tmp_path, max_steps=max_steps, limit_val_batches=0, **kwargs
    )
    trainer.fit(model, _data())
    return model, spy, trainer


def _timeline(callback: AdaptiveBandLimit) -> list[tuple[int, int, float]]:
    return [(d["step"], d["rung"], d["compression"]) for d in callback.decisions]


def test_rungs_first_then_compression_on_rung_0_then_back(tmp_path: Path) -> None:
    callback = _callback()
    keys = list(_model().state_dict())
    model, spy, trainer = _fit(callback, tmp_path)
    timeline = _timeline(callback)
    assert [s for s, _, _ in timeline] == list(range(1, 21))  # a check every step
    assert timeline[:5] == [(s, 0, 0.0) for s in range(1, 6)]
    assert timeline[5] == (6, 1, 0.0)  # the first raise: one rung, exact
    assert callback.decisions[5]["reason"] == "raise"
    assert callback.decisions[5]["checkpointed_units"] == 2
    assert timeline[6:8] == [(7, 2, 0.0), (8, 4, 0.0)]  # the exact rungs first, the ramp met ahead
    # the top rung measured short and the continuum unknown: max_compression, no unit checkpointed
    assert timeline[8] == (9, 0, 0.9)
    assert callback.decisions[8]["reason"] == "raise"
    assert callback.decisions[8]["checkpointed_units"] == 0
    assert callback.controller.top == 4
    # compression only ever above 0 on rung 0, and a rung was climbed first
    lossy = [(s, r, c) for s, r, c in timeline if c > 0]
    assert lossy and all(r == 0 for _, r, _ in lossy)
    first_lossy = timeline.index(lossy[0])
    assert all(c == 0 for _, _, c in timeline[:first_lossy])
    assert max(r for _, r, _ in timeline[:first_lossy]) >= 1
    # released: the lossy part first, to an exact setting, back to the plain model
    released = timeline[timeline.index(lossy[-1]) + 1]
    assert released[2] == 0.0 and callback.decisions[timeline.index(released)]["reason"] == "lower"
    assert all(c == 0 for _, _, c in timeline[timeline.index(released) :])
    assert timeline[-1][1:] == (0, 0.0)
    # records
    for record in callback.decisions:
        assert {"step", "rung", "checkpointed_units", "compression", "reason", "free_bytes"} <= set(record)
        assert {"job_peak_bytes", "slowdown"} <= set(record)
        assert record["checkpointed_units"] == 2 * record["rung"]  # 2 blocks a stage
        assert record["job_peak_bytes"] > 0
    # the first (profiling) step's time is no rung's; rung 0 is timed from the second step on
    assert callback.decisions[0]["slowdown"] is None
    assert callback.decisions[1]["slowdown"] == 1.0  # rung 0 over itself
    # the model ran at the decided rung: checkpointed blocks as each next step started
    for record in callback.decisions[:-1]:
        assert spy.checkpointed[record["step"]] == record["checkpointed_units"], record
    assert {layer.compression for _, layer in bandlimited_layers(model)} == {0.0}
    # learned: memory per rung (rung 0 measured, rung 1 too), the stage savings, and rung 0's
    # memory versus compression (the floor and 0.9)
    ladder = callback.controller
    assert {0, 1} <= set(ladder.rung_memory.points)
    assert ladder.stage_savings is not None and len(ladder.stage_savings) == 4
    assert all(a > b > 0 for a, b in zip(ladder.stage_savings, ladder.stage_savings[1:]))
    assert ladder.rung_memory.points[1] < ladder.rung_memory.points[0]  # rung 1 measured leaner
    assert set(ladder.compression_memory.points) == {0.0, 0.9}
    # why the continuum is on rung 0: at 0.9 the plain blocks keep less than the top rung would
    assert ladder.compression_memory.points[0.9] < ladder.predict_rung(4)
    assert spy.final_state is not None and spy.final_state["stages"] == STAGES
    # teardown: the user's model as it was
    assert [type(model.get_submodule(n)) for n in BLOCKS] == [_BasicBlock] * 8
    assert not any(is_checkpointed(m) for m in model.modules())
    assert list(model.state_dict()) == keys
    assert callback.checkpointed_units == []
    assert {"AdaptiveBandLimit/rung", "AdaptiveBandLimit/checkpointed_units"} <= set(trainer.callback_metrics)


def test_release_from_the_continuum_to_the_fastest_exact_rung_that_fits(tmp_path: Path) -> None:
    # As PRESSURE, but the co-tenant first shrinks only to 41.4 MB free: at 0.9 the job needs
    # about 0.96 MB and may use 1.4 MB more; rung 4 (measured about 1.7 MB) fits, rung 2 (about
    # 2.4 MB) not, rung 3 was not visited (predicted as rung 2).
    frees = PRESSURE[:10] + [41_400_000] * 4 + [80 * M] * 6
    callback = _callback(frees)
    _, spy, _ = _fit(callback, tmp_path)
    timeline = _timeline(callback)
    assert timeline[5:9] == [(6, 1, 0.0), (7, 2, 0.0), (8, 4, 0.0), (9, 0, 0.9)]
    assert timeline[11] == (12, 4, 0.0) and callback.decisions[11]["reason"] == "lower"
    assert spy.checkpointed[12] == 8
    # then, with more room, down the exact rungs to the plain model
    rungs = [r for _, r, _ in timeline[11:]]
    assert all(b <= a for a, b in zip(rungs, rungs[1:])) and rungs[-1] == 0
    assert all(c == 0 for _, _, c in timeline[11:])


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
    # after step 7's: the next rung (rung 1 measured short): the first two stages' four blocks
    assert seen[7] == (Setting(2, 0.0), BLOCKS[:4])


def test_compression_lever_only_never_checkpoints(tmp_path: Path) -> None:
    callback = _callback(levers=["compression"])
    model, spy, _ = _fit(callback, tmp_path)
    assert callback.levers == ("compression",)
    assert {d["rung"] for d in callback.decisions} == {0}
    assert {d["checkpointed_units"] for d in callback.decisions} == {0}
    assert set(spy.checkpointed.values()) == {0}
    compressions = [d["compression"] for d in callback.decisions]
    assert compressions[5] == pytest.approx(0.3)  # raise_step on the first pressure check
    assert compressions[-1] == 0.0
    assert callback.controller.rungs == 0 and callback.controller.stage_savings is None
    assert spy.final_state is not None and spy.final_state["stages"] is None


def test_checkpoint_lever_only_stays_exact(tmp_path: Path) -> None:
    callback = _callback(levers=["checkpoint"])
    model, spy, _ = _fit(callback, tmp_path)
    assert callback.levers == ("checkpoint",)
    assert {d["compression"] for d in callback.decisions} == {0.0}
    assert {layer.compression for _, layer in bandlimited_layers(model)} == {0.0}
    rungs = [d["rung"] for d in callback.decisions]
    # up the rungs (each measured short; the ramp met ahead past rung 3) to the top, no further
    assert rungs[5:11] == [1, 2, 4, 4, 4, 4]
    assert max(rungs) == 4
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
        ({"continuum_rung": "bottom"}, ValueError),
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
    compressions = [d["compression"] for d in callback.decisions]
    assert compressions[5] == pytest.approx(0.3)  # no rungs: raise_step, not max_compression


def test_checkpoint_units_patterns_choose_the_units(tmp_path: Path) -> None:
    callback = _callback(checkpoint_units=["backbone.[3-6]"], levers=["checkpoint"])
    model, spy, _ = _fit(callback, tmp_path)
    assert callback.controller.top == 2  # two stages of two blocks
    assert max(spy.checkpointed.values()) == 4
    assert {d["rung"] for d in callback.decisions} == {0, 1, 2}
    assert spy.final_state is not None and spy.final_state["stages"] == STAGES[:2]


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
        stages = self.adaptive._rungs.stages
        self.clock.now += 1.0 + 0.5 * (stages.rung if stages is not None else 0)


def _fit_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> AdaptiveBandLimit:
    clock = _Clock()
    monkeypatch.setattr(adaptive_module, "time", clock)
    callback = _callback(**kwargs)
    trainer = cpu_trainer(
        [_Tick(clock, callback), callback], default_root_dir=tmp_path, max_steps=20, limit_val_batches=0
    )
    trainer.fit(_model(), _data())
    return callback


def test_max_slowdown_takes_slow_rungs_off_the_ladder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # exact levers only, so the ladder climbs to the top rung and each rung's time is measured
    callback = _fit_timed(tmp_path, monkeypatch, max_slowdown=1.8, levers=["checkpoint"])
    ladder = callback.controller
    assert ladder.rung_seconds[0] == 1.0  # the profiling step (also 1 s here) is not rung 0's
    assert callback.decisions[0]["slowdown"] is None
    assert ladder.slowdown(1) == pytest.approx(1.5)
    assert ladder.slowdown(2) == pytest.approx(2.0)
    assert ladder.top == 1  # rungs 2.. cost more than 1.8x: off the ladder
    # rung 2 ran once, was measured too slow, and the same check went below it; never above
    assert [d["rung"] for d in callback.decisions[5:9]] == [1, 2, 1, 1]
    assert all(d["rung"] <= 1 for d in callback.decisions[7:])
    assert ladder.slowdown(3) is None and ladder.slowdown(4) is None  # never run
    assert {d["compression"] for d in callback.decisions} == {0.0}
    assert callback.decisions[-1]["rung"] == 0


def test_max_slowdown_below_every_rung_leaves_the_compression_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    callback = _fit_timed(tmp_path, monkeypatch, max_slowdown=1.3)
    ladder = callback.controller
    assert ladder.slowdown(1) == pytest.approx(1.5) and ladder.top == 0
    timeline = _timeline(callback)
    assert timeline[5] == (6, 1, 0.0)
    # rung 1 measured too slow on step 7: no rung left, so the compression, by raise_step
    assert timeline[6] == (7, 0, pytest.approx(0.3))
    assert all(r == 0 for _, r, _ in timeline[6:])
    assert timeline[-1][1:] == (0, 0.0)


# -- DDP agreement, in process ----------------------------------------------------------------


class _OtherRank:
    """Stands in for a two-process strategy: ``reduce(..., reduce_op="max")`` of this rank's
    vector and the other rank's. The signature is Lightning's ``Strategy.reduce(tensor,
    group=None, reduce_op="mean")``: a reduce_op passed positionally lands in ``group``, which
    DDP then looks up as a process group (and fails on)."""

    def __init__(self, other: list[float]) -> None:
        self.other = other
        self.calls: list[tuple[Any, Any]] = []

    def reduce(self, tensor: torch.Tensor, group: Any = None, reduce_op: Any = "mean") -> torch.Tensor:
        self.calls.append((group, reduce_op))
        assert group is None, f"group={group!r}: the reduce_op was passed as the process group"
        assert reduce_op == "max", reduce_op
        return torch.maximum(tensor, torch.tensor(self.other, dtype=tensor.dtype))


class _TwoRanks:
    world_size = 2

    def __init__(
        self,
        free: int,
        total: int,
        peak: int | None,
        top: int,
        on_top: bool = False,
        failed: bool = False,
        base: int | None = None,
        splits: int = 0,
    ) -> None:
        measured = peak is not None and base is not None
        increment = float(peak - base) if measured else 0.0
        self.strategy = _OtherRank(
            [
                -free,
                -total,
                float(peak or 0),
                -top,
                -float(on_top),
                float(failed),
                increment,
                float(not measured),
                -float(splits),
            ]
        )


def _agree(
    callback: AdaptiveBandLimit,
    trainer: _TwoRanks,
    reading: MemoryReading,
    peak: int | None,
    base: int | None = None,
):
    """What ``callback`` decides from under DDP, as its check computes it."""
    mine = None if reading is None else JobMemory(reading, peak, base)  # None: this rank's probe failed
    return callback._events.ranks_agreed(trainer.strategy, mine, callback._device)


def _agreeing(top: int = 4) -> AdaptiveBandLimit:
    callback = _callback()
    callback._device = torch.device("cpu")
    callback.controller.on_stages_measured([400.0, 200.0, 100.0, 50.0])
    callback.controller.top = top
    return callback


@pytest.mark.parametrize(
    ("mine", "other", "agreed"),
    [
        # (free, total, peak, top) of this rank, of the other, and what both decide from
        ((600, 1000, 300, 4), (200, 1000, 500, 4), (200, 1000, 500, 4)),  # the tighter rank wins
        ((200, 1000, 500, 4), (600, 1000, 300, 4), (200, 1000, 500, 4)),
        ((600, 1000, None, 4), (700, 1000, None, 3), (600, 1000, None, 3)),  # the lower top
        ((600, 900, 100, 2), (650, 1000, 100, 4), (600, 900, 100, 2)),  # the smaller device
    ],
)
def test_ranks_decide_from_the_least_free_memory_largest_peak_and_lowest_top(
    mine: tuple[int, int, int | None, int],
    other: tuple[int, int, int | None, int],
    agreed: tuple[int, int, int | None, int],
) -> None:
    callback = _agreeing(top=mine[3])
    trainer = _TwoRanks(*other)
    reading, peak, base = _agree(
        callback, trainer, MemoryReading(total=mine[1], free=mine[0], source="scripted"), mine[2]
    )
    assert (reading.free, reading.total, peak, callback.controller.top) == agreed
    assert base is None  # no rank measured what it held at the step's start
    assert trainer.strategy.calls == [(None, "max")]  # one collective, reduce_op by keyword


@pytest.mark.parametrize(
    ("mine", "other", "agreed"),
    [
        # (peak, base) of this rank, of the other, and the (peak, base) both decide from
        ((500, 400), (450, 300), (500, 350)),  # the largest peak, the largest increment (150)
        ((450, 300), (500, 400), (500, 350)),
        ((500, 400), (450, None), (500, None)),  # a rank without its start: no base
        ((500, None), (450, 300), (500, None)),
    ],
)
def test_ranks_decide_from_the_largest_step_increment(
    mine: tuple[int, int | None], other: tuple[int, int | None], agreed: tuple[int, int | None]
) -> None:
    callback = _agreeing()
    trainer = _TwoRanks(600, 1000, other[0], 4, base=other[1])
    _, peak, base = _agree(callback, trainer, MemoryReading(1000, 600, "scripted"), *mine)
    assert (peak, base) == agreed


@pytest.mark.parametrize(("other", "agreed"), [(3, (2, 4, 8)), (1, (2,)), (0, ())])
def test_ranks_split_only_as_far_as_every_rank_can(other: int, agreed: tuple[int, ...]) -> None:
    # a rank whose batch is smaller, or whose trial refused the split, has fewer splits (or none)
    callback = _agreeing()
    callback.controller.on_splits_chosen((2, 4, 8))
    _agree(callback, _TwoRanks(600, 1000, 300, 4, splits=other), MemoryReading(1000, 600, "scripted"), 300)
    assert callback.controller.splits == agreed


@pytest.mark.parametrize(("mine", "other"), [(True, True), (True, False), (False, True), (False, False)])
def test_ranks_run_the_continuum_on_the_top_rung_only_if_every_rank_can(mine: bool, other: bool) -> None:
    callback = _agreeing()
    callback.controller.on_continuum_chosen(mine)
    _agree(callback, _TwoRanks(600, 1000, 300, 4, on_top=other), MemoryReading(1000, 600, "scripted"), 300)
    assert callback.controller.continuum_on_top == (mine and other)


def test_a_top_rung_a_peer_lowered_moves_the_continuum_down_with_it() -> None:
    # The continuum runs on the top rung; this rank learned it on rung 4. A peer's top rung is
    # 2: the agreed top is 2, and the compression model learned on rung 4 must go (as when the
    # rank lowers its own top): it starts again from rung 2's measured memory.
    callback = _agreeing(top=4)
    ladder = callback.controller
    ladder.on_continuum_chosen(True)
    ladder.observe(Setting(2, 0.0), 700)
    ladder.observe(Setting(4, 0.0), 650)
    ladder.observe(Setting(4, 0.5), 400)
    assert ladder.compression_memory.points == {0.0: 650, 0.5: 400}
    _agree(callback, _TwoRanks(600, 1000, 300, 2, on_top=True), MemoryReading(1000, 600, "scripted"), 300)
    assert ladder.top == ladder.lossy_rung == 2
    assert ladder.compression_memory.points == {0.0: 700}


@pytest.mark.parametrize("mine_failed", [False, True])
def test_a_rank_without_a_reading_makes_every_rank_skip_the_check(mine_failed: bool) -> None:
    # a probe that failed (or stopped) on one rank: that rank still meets the others' collective,
    # and every rank skips the check (else the others would wait in the collective for ever)
    callback = _agreeing(top=4)
    reading = None if mine_failed else MemoryReading(total=1000, free=600, source="scripted")
    trainer = _TwoRanks(600, 1000, 300, 2, failed=not mine_failed)
    assert _agree(callback, trainer, reading, 300) is None  # type: ignore[arg-type]
    assert callback.controller.top == 4  # nothing agreed: the other rank's lower top not taken
    assert trainer.strategy.calls == [(None, "max")]  # the one collective, on both ranks


def test_ranks_fed_the_same_inputs_take_the_same_decisions() -> None:
    # Two controllers with the same history, one of which saw less free memory locally: after
    # agreeing on the inputs, every decision (and so every rung and compression) is the same.
    ranks = [_agreeing(), _agreeing()]
    frees = [[900, 900], [900, 150], [100, 400], [400, 400], [900, 900]] + [[950, 950]] * 60
    settings: list[list[Setting]] = [[], []]
    for free_pair in frees:
        for me, callback in enumerate(ranks):
            other = free_pair[1 - me]
            trainer = _TwoRanks(other, 1000, 500, 4)
            reading, peak, _ = _agree(
                callback, trainer, MemoryReading(total=1000, free=free_pair[me], source="scripted"), 500
            )
            decision = callback.controller.decide(reading, callback.setting)
            callback.compression, callback.rung = decision.compression, decision.rung
            settings[me].append(decision.setting)
    assert settings[0] == settings[1]
    assert any(s.rung > 0 for s in settings[0])  # it did climb
    assert settings[0][-1] == Setting(0, 0.0)  # and both released together


# -- out-of-memory backstop -------------------------------------------------------------------


class _OutOfMemory(ImageClassifier):
    """Simulates a job that runs out of memory where ``fits(model)`` is false (set by
    :func:`_oom_model`): the error is raised at the start of ``training_step``, in the middle of
    the forward (before block ``backbone.5`` runs) or at its end."""

    def __init__(self, where: str) -> None:
        super().__init__("cifar_resnet18", width=4)
        self.where = where
        self.fits: Callable[[_OutOfMemory], bool] = lambda model: True
        self.ooms = 0
        if where == "middle":
            self.backbone[5].register_forward_pre_hook(lambda *_: self._maybe_oom())

    @property
    def step(self) -> int:
        return self.trainer.global_step

    @property
    def checkpointed(self) -> bool:
        return is_checkpointed(self.backbone[3])

    @property
    def compression(self) -> float:
        return next(layer for _, layer in bandlimited_layers(self)).compression

    def _maybe_oom(self) -> None:
        if self.training and torch.is_grad_enabled() and not self.fits(self):
            self.ooms += 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.where == "start":
            self._maybe_oom()
        loss = super().training_step(batch, batch_idx)
        if self.where == "end":
            self._maybe_oom()
        return loss


def _oom_model(where: str, fits: Callable[[_OutOfMemory], bool]) -> _OutOfMemory:
    model = _OutOfMemory(where)
    model.fits = fits
    return model


def _fit_oom(
    tmp_path: Path, model: _OutOfMemory, max_steps: int = 6, **kwargs: Any
) -> tuple[AdaptiveBandLimit, _Spy]:
    callback = _callback(HOLD, **kwargs)
    try:
        with pytest.warns(UserWarning, match="out of memory in training_step"):
            _, spy, _ = _fit(callback, tmp_path, max_steps=max_steps, model=model)
    except torch.cuda.OutOfMemoryError:
        pytest.fail(
            f"the retry ran out of memory again, at {callback.decisions[-1:]}; "
            f"ladder {callback.controller.state_dict()}"
        )
    return callback, spy


def _reasons(callback: AdaptiveBandLimit) -> list[tuple[int, str, int, float]]:
    return [(d["step"], d["reason"], d["rung"], d["compression"]) for d in callback.decisions]


def test_oom_backstop_retries_on_the_top_rung_exactly(tmp_path: Path) -> None:
    # fits from step 2 on only with the blocks checkpointed (after the profiling step)
    model = _oom_model("end", lambda m: m.step < 2 or m.checkpointed)
    callback, spy = _fit_oom(tmp_path, model)
    assert model.ooms == 1
    assert _reasons(callback) == [
        (1, "hold", 0, 0.0),
        (2, "hold", 0, 0.0),
        (2, "oom", 4, 0.0),  # the batch of global step 2, retried on the top rung
        (3, "hold", 4, 0.0),
        (4, "hold", 4, 0.0),
        (5, "hold", 4, 0.0),
        (6, "hold", 4, 0.0),
    ]
    assert callback.decisions[2]["checkpointed_units"] == 8
    assert callback.controller.oom_floor == 0.0  # an exact retry sets no compression floor
    assert spy.checkpointed[2] == 0 and spy.checkpointed[3] == 8
    assert "training_step" not in model.__dict__  # the guard is removed at teardown
    assert not any(is_checkpointed(m) for m in model.modules())


def test_oom_backstop_retry_does_not_learn_the_failed_attempt(tmp_path: Path) -> None:
    # The failed attempt ran its whole forward on rung 0 (the error comes at the end of
    # training_step): its bytes must not be learned as the retry's, on rung 4.
    model = _oom_model("end", lambda m: m.step < 2 or m.checkpointed)
    callback, _ = _fit_oom(tmp_path, model)
    peaks = {d["step"]: d["job_peak_bytes"] for d in callback.decisions if d["reason"] == "hold"}
    assert peaks[3] is None  # the retried step: not measured
    assert peaks[4] == peaks[5] > 0  # later steps on rung 4, the same batch size
    points = callback.controller.rung_memory.points
    assert points[4] == peaks[4] < points[0] == peaks[1]


def test_oom_backstop_on_the_top_rung_goes_to_max_compression_on_rung_0(tmp_path: Path) -> None:
    # fits on the top rung until step 4, then only at compression 0.5 or more
    model = _oom_model("end", lambda m: m.step < 2 or (m.checkpointed and m.step < 4) or m.compression >= 0.5)
    callback, spy = _fit_oom(tmp_path, model)
    assert model.ooms == 2
    oom = [r for r in _reasons(callback) if r[1] == "oom"]
    assert oom == [(2, "oom", 4, 0.0), (4, "oom", 0, 0.9)]
    assert callback.controller.oom_floor == 0.9  # releases never go below what ran out of memory
    assert [r[2:] for r in _reasons(callback)[-2:]] == [(0, 0.9), (0, 0.9)]
    assert spy.checkpointed[5] == 0  # the continuum: no unit checkpointed
    assert model.compression == 0.9


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_oom_in_the_first_step_keeps_the_whole_ladder(tmp_path: Path, where: str) -> None:
    # An out-of-memory error in the first step, which also measures the units, possibly before
    # all of them ran: the retry checkpoints every unit and profiles shapes only, so the ladder
    # knows every stage (not what each frees) and sits on its top rung.
    model = _oom_model(where, lambda m: m.checkpointed)
    callback, spy = _fit_oom(tmp_path, model)
    assert model.ooms == 1
    ladder = callback.controller
    assert ladder.rungs == ladder.top == 4, ladder.state_dict()
    assert ladder.stage_savings is None  # measured checkpointed: unknown
    assert spy.final_state is not None and spy.final_state["stages"] == STAGES
    assert {(r[2], r[3]) for r in _reasons(callback)} == {(4, 0.0)}
    assert spy.checkpointed[1] == 8
    # the profiling retry's bytes (checkpointed) are nobody's peak; rung 4 is learned afterwards
    first = next(d for d in callback.decisions if d["reason"] != "oom")
    assert (first["step"], first["job_peak_bytes"]) == (1, None)
    assert set(ladder.rung_memory.points) == {4}
    assert ladder.compression_memory.points == {}


def test_oom_in_the_first_step_is_kept_in_the_decisions(tmp_path: Path) -> None:
    # "every change is also reported with its reason and kept in decisions": the move from
    # rung 0 to every unit checkpointed after the first step's out-of-memory error, too, as for
    # an out-of-memory error in any later step
    model = _oom_model("start", lambda m: m.checkpointed)
    callback, _ = _fit_oom(tmp_path, model, max_steps=2)
    assert [r for r in _reasons(callback) if r[1] == "oom"] == [(0, "oom", 4, 0.0)], _reasons(callback)


def test_oom_in_the_first_step_retries_only_once(tmp_path: Path) -> None:
    model = _oom_model("start", lambda m: False)
    callback = _callback(HOLD)
    with (
        pytest.warns(UserWarning, match="retrying the batch once with every unit checkpointed"),
        pytest.raises(torch.cuda.OutOfMemoryError),
    ):
        _fit(callback, tmp_path, max_steps=3, model=model)
    assert model.ooms == 2
    # the failed fit left nothing hooked into torch: no saved-tensor hooks (its profile's meter),
    # no guarded step, no checkpointed unit
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert "training_step" not in vars(model)
    assert not any(is_checkpointed(m) for m in model.modules())


# -- resume -----------------------------------------------------------------------------------


def _fit_and_save(tmp_path: Path, stop_after: type, **kwargs: Any) -> tuple[AdaptiveBandLimit, Path]:
    callback = _callback(PRESSURE[:10], **kwargs)  # stops under pressure
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, every_n_train_steps=10, save_top_k=0)
    cpu_trainer(
        [callback, saver, stop_after(10)],
        default_root_dir=tmp_path,
        max_steps=14,
        limit_val_batches=0,
        enable_checkpointing=True,
    ).fit(_model(), _data())
    return callback, tmp_path / "ckpt" / "last.ckpt"


def _resume(
    tmp_path: Path, ckpt: Path, frees: list[int], **kwargs: Any
) -> tuple[AdaptiveBandLimit, _Spy, ImageClassifier]:
    resumed = _callback(frees, **kwargs)
    spy = _Spy(resumed)
    model = _model()
    cpu_trainer([resumed, spy], default_root_dir=tmp_path, max_steps=14, limit_val_batches=0).fit(
        model, _data(), ckpt_path=ckpt
    )
    return resumed, spy, model


def _saved_state(ckpt: Path) -> dict[str, Any]:
    saved = torch.load(ckpt, weights_only=False)["callbacks"]
    return next(v for k, v in saved.items() if k.startswith("AdaptiveBandLimit"))


def test_resume_applies_the_saved_rung_before_the_first_step(tmp_path: Path, stop_after: type) -> None:
    # exact levers only: the run stops on the top rung
    callback, ckpt = _fit_and_save(tmp_path, stop_after, levers=["checkpoint"])
    assert callback.setting == Setting(4, 0.0)
    state = _saved_state(ckpt)
    assert state["rung"] == 4 and state["stages"] == STAGES
    resumed, spy, _ = _resume(tmp_path, ckpt, HOLD)  # both levers; the hold band: holds
    assert [d["step"] for d in resumed.decisions] == [11, 12, 13, 14]
    assert {(d["rung"], d["compression"]) for d in resumed.decisions} == {(4, 0.0)}
    assert spy.checkpointed[10] == 8  # the first resumed batch ran on rung 4 already
    assert set(spy.checkpointed.values()) == {8}
    ladder, before = resumed.controller, callback.controller
    assert ladder.rungs == ladder.top == 4
    # no profiling step: the savings measured in the first run, and the first resumed step was
    # measured on rung 4, as the first run measured it
    assert ladder.stage_savings == before.stage_savings
    assert resumed.decisions[0]["job_peak_bytes"] == before.rung_memory.points[4]
    assert set(ladder.rung_memory.points) == set(before.rung_memory.points) == {0, 1, 2, 4}


def test_resume_restores_the_continuum_and_what_the_ladder_learned(tmp_path: Path, stop_after: type) -> None:
    callback, ckpt = _fit_and_save(tmp_path, stop_after)
    assert callback.setting == Setting(0, 0.9)  # stopped on the continuum
    state = _saved_state(ckpt)
    assert state["rung"] == 0 and state["stages"] == STAGES
    assert state["controller"]["rung_memory"] == callback.controller.rung_memory.state_dict()
    resumed, spy, model = _resume(tmp_path, ckpt, HOLD)
    assert resumed.setting == Setting(0, 0.9)
    assert {(d["rung"], d["compression"]) for d in resumed.decisions} == {(0, 0.9)}
    assert set(spy.checkpointed.values()) == {0}
    assert {layer.compression for _, layer in bandlimited_layers(model)} == {0.9}
    ladder, before = resumed.controller, callback.controller
    assert ladder.rungs == ladder.top == 4
    # the memory measured per rung in the first run (no step of the resumed run ran at the floor
    # compression, so nothing was added or averaged in), the times, and the stage savings
    # measured at the floor compression (no profiling step of the compressed model)
    assert ladder.rung_memory.points == before.rung_memory.points
    assert set(ladder.rung_seconds) == set(before.rung_seconds)
    assert ladder.stage_savings == before.stage_savings
    assert set(before.compression_memory.points) <= set(ladder.compression_memory.points)


@pytest.mark.parametrize(
    ("units", "stages"),
    [(["backbone.[3-6]"], 2), (["no.such.module*"], 0)],
    ids=["fewer-stages", "no-units"],
)
def test_resume_with_other_units_measures_them_again(
    tmp_path: Path, stop_after: type, units: list[str], stages: int
) -> None:
    # the checkpoint was saved on rung 4 of 4 stages; the resumed run checkpoints other units
    _, ckpt = _fit_and_save(tmp_path, stop_after, levers=["checkpoint"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "matches no module"
        resumed, spy, _ = _resume(tmp_path, ckpt, HOLD, checkpoint_units=units)
    assert [d["step"] for d in resumed.decisions] == [11, 12, 13, 14]  # trained to the end
    ladder = resumed.controller
    assert ladder.rungs == ladder.top == stages
    for record in resumed.decisions:
        assert record["rung"] <= stages, record
        assert record["checkpointed_units"] == 2 * record["rung"], record
    assert max(spy.checkpointed.values()) <= 2 * stages


def test_the_plan_outlives_the_release_until_a_next_fit_finds_its_units() -> None:
    # issue 68: the end of a fit gives the user's model back, not what was measured of it
    rungs, model = ExactRungs(None, order="stages"), _model()
    rungs.find(model, None)
    assert rungs.plan is None  # found, not measured yet
    rungs.stages.set_stages(STAGES)  # type: ignore[union-attr]
    rungs.rung = 4
    assert rungs.checkpointed() == BLOCKS
    rungs.release()
    assert not any(is_checkpointed(model.get_submodule(name)) for name in BLOCKS)
    assert (rungs.rung, rungs.plan) == (4, STAGES)  # what a checkpoint saved after the fit holds
    rungs.find(torch.nn.Sequential(torch.nn.Linear(2, 2)), None)  # a next fit: no units
    assert rungs.plan is None


def test_resume_with_the_compression_lever_only_drops_the_rungs(tmp_path: Path, stop_after: type) -> None:
    callback, ckpt = _fit_and_save(tmp_path, stop_after, levers=["checkpoint"])
    resumed, spy, _ = _resume(tmp_path, ckpt, HOLD, levers=["compression"])
    assert {(d["rung"], d["compression"]) for d in resumed.decisions} == {(0, 0.0)}
    assert set(spy.checkpointed.values()) == {0}
    assert resumed.controller.rungs == resumed.controller.top == 0
    assert resumed.controller.compression_memory.points == callback.controller.compression_memory.points


# -- DDP --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ddp_ranks_follow_the_same_ladder(tmp_path: Path) -> None:
    ranks = run_ddp_script(Path(__file__).with_name("ddp_ladder_script.py"), tmp_path)
    assert ranks[0]["timeline"] == ranks[1]["timeline"]
    timeline = [tuple(t) for t in ranks[0]["timeline"]]
    assert len(timeline) == ranks[0]["steps"] == 16  # trained to the end on both ranks
    # rank 1 checkpoints only the first two stages: both ranks' top rung is 2
    assert ranks[0]["top"] == ranks[1]["top"] == 2
    assert ranks[0]["rungs"] == 4 and ranks[1]["rungs"] == 2
    assert max(r for _, r, _ in timeline) in (1, 2)  # rank 1's pressure moved both, below the top
    lossy = [(r, c) for _, r, c in timeline if c > 0]
    # band-limited basic blocks keep their kept spectrum: the continuum is on the agreed top rung
    assert lossy and {r for r, _ in lossy} == {2}
    first_lossy = next(i for i, (_, _, c) in enumerate(timeline) if c > 0)
    assert all(c == 0 for _, _, c in timeline[:first_lossy]) and timeline[first_lossy - 1][1] >= 1
    assert timeline[-1][1:] == (0, 0.0)
    assert ranks[0]["checkpointed"] == ranks[1]["checkpointed"]
    assert max(len(names) for names in ranks[0]["checkpointed"]) == 4
    assert ranks[0]["layers"] == ranks[1]["layers"]


def test_ddp_ranks_run_rank_zeros_cost_ordered_rungs(tmp_path: Path) -> None:
    ranks = run_ddp_script(
        Path(__file__).with_name("ddp_ladder_script.py"), tmp_path, LADDER_RUNG_ORDER="cost"
    )
    plan = ranks[0]["plan"]
    assert plan and plan == ranks[1]["plan"]
    assert any(move.startswith("pointwise:") for rung in plan for move in rung)
    assert ranks[0]["timeline"] == ranks[1]["timeline"] and len(ranks[0]["timeline"]) == 16
    assert max(r for _, r, _ in (tuple(t) for t in ranks[0]["timeline"])) >= 1
    assert ranks[0]["checkpointed"] == ranks[1]["checkpointed"]
