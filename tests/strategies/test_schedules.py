"""SampleSchedule: the LR follows samples seen, so a change of global batch keeps it on its curve."""

from __future__ import annotations

import io
import itertools
import math
import warnings
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from _helpers import cpu_trainer
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from lightning_bandlimit.strategies.schedules import SampleSchedule, lr_multiplier, rescale_base_lrs

BASE = 0.1


def sgd(lr: float | list[float] = BASE) -> torch.optim.Optimizer:
    lrs = lr if isinstance(lr, list) else [lr]
    return torch.optim.SGD([{"params": [nn.Parameter(torch.zeros(2))], "lr": value} for value in lrs])


def make(lr: float | list[float] = BASE, **kwargs: Any) -> tuple[torch.optim.Optimizer, SampleSchedule]:
    optimizer = sgd(lr)
    return optimizer, SampleSchedule(optimizer, **kwargs)


def lr_of(optimizer: torch.optim.Optimizer, group: int = 0) -> float:
    return float(optimizer.param_groups[group]["lr"])


def max_slope(total: float, warmup: float, min_lr_ratio: float = 0.0) -> float:
    """The largest |d multiplier / d sample| of the cosine curve (warmup or decay)."""
    decay = (1 - min_lr_ratio) * math.pi / 2 / (total - warmup)
    return max(1 / warmup if warmup else 0.0, decay)


def resized_run(
    optimizer: torch.optim.Optimizer, scheduler: Any, batches: list[int], sample_schedule: bool = True
) -> tuple[list[float], list[float]]:
    """Train (optimizer.step, then the scheduler) with the given global batch per step.

    Returns the samples seen before each step and the LR that step used.
    """
    seen, lrs, samples = [], [], 0.0
    for batch in batches:
        seen.append(samples)
        lrs.append(lr_of(optimizer))
        optimizer.step()
        samples += batch
        if sample_schedule:
            scheduler.advance(batch)
        scheduler.step()
    return seen, lrs


TOTAL, WARMUP = 3840, 640  # 60 steps of 64
# 30 steps at a global batch of 64, then a resize to 32 (e.g. half the processes) until past the end
RESIZED = [64] * 30 + [32] * 80


def test_resize_keeps_lr_on_the_sample_curve() -> None:
    optimizer, scheduler = make(total_samples=TOTAL, warmup_samples=WARMUP)
    seen, lrs = resized_run(optimizer, scheduler, RESIZED)
    for samples, lr in zip(seen, lrs):
        assert lr == pytest.approx(BASE * lr_multiplier(samples, TOTAL, WARMUP), abs=1e-12)
    slope = BASE * max_slope(TOTAL, WARMUP)
    for i in range(1, len(lrs)):
        assert abs(lrs[i] - lrs[i - 1]) <= slope * (seen[i] - seen[i - 1]) + 1e-12, i
    # at the resize the change is that of one batch-64 step on the curve, and the schedule ends flat
    assert abs(lrs[31] - lrs[30]) <= slope * 32 + 1e-12
    assert seen[-1] > TOTAL and lrs[-1] == 0.0


def test_step_based_cosine_leaves_the_curve_after_a_resize() -> None:
    """The pain SampleSchedule removes: T_max planned for batch 64 is wrong once the batch is 32."""
    optimizer = sgd()
    step_based = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=TOTAL // 64)
    seen, lrs = resized_run(optimizer, step_based, RESIZED, sample_schedule=False)
    curve = [BASE * lr_multiplier(s, TOTAL) for s in seen]
    deviation = [abs(a - b) for a, b in zip(lrs, curve)]
    assert max(deviation[:31]) < 1e-9  # on the curve while the batch is the planned one
    assert max(deviation[31:]) > 0.1 * BASE  # far off it after the resize
    # re-planning T_max for the new batch at the same step count makes the LR jump instead
    optimizer2 = sgd()
    replanned = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer2, T_max=TOTAL // 32)
    for _ in range(30):
        optimizer2.step()
        replanned.step()
    assert lr_of(optimizer2) - lrs[30] > 0.2 * BASE


def test_warmup_is_linear_from_zero() -> None:
    optimizer, scheduler = make(total_samples=1000, warmup_samples=100)
    assert lr_of(optimizer) == 0.0
    for progress in [0, 10, 25.5, 50, 99.5]:
        scheduler.set_progress(progress)
        assert lr_of(optimizer) == pytest.approx(BASE * progress / 100)
    scheduler.set_progress(100)
    assert lr_of(optimizer) == pytest.approx(BASE)
    assert scheduler.fraction == pytest.approx(0.1)


@pytest.mark.parametrize("kind", ["cosine", "linear"])
def test_decay_ends_at_min_lr_ratio_and_stays(kind: str) -> None:
    optimizer, scheduler = make(total_samples=1000, warmup_samples=100, kind=kind, min_lr_ratio=0.25)
    values = []
    for progress in range(100, 1601, 50):
        scheduler.set_progress(progress)
        values.append(lr_of(optimizer))
    assert values[0] == pytest.approx(BASE)
    assert all(b <= a + 1e-15 for a, b in itertools.pairwise(values))  # non-increasing
    assert min(values) == pytest.approx(0.25 * BASE)
    assert values[-1] == values[18] == pytest.approx(0.25 * BASE)  # progress 1000 and after
    scheduler.set_progress(550)  # half of the decay
    middle = 0.25 + 0.75 * 0.5
    assert lr_of(optimizer) == pytest.approx(BASE * middle)


def test_cosine_and_linear_shapes_differ_and_constant_stays_flat() -> None:
    assert lr_multiplier(325, 1000, 100, "linear") == pytest.approx(0.75)
    assert lr_multiplier(325, 1000, 100, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert [lr_multiplier(p, 1000, 100, "constant", 0.5) for p in (50, 100, 999, 5000)] == [
        0.5,
        1.0,
        1.0,
        1.0,
    ]
    assert lr_multiplier(100, 100, 100, "cosine", 0.3) == pytest.approx(0.3)  # no decay phase


def test_step_recomputes_without_advancing() -> None:
    optimizer, scheduler = make(total_samples=1000, warmup_samples=100)
    scheduler.advance(40.5)
    before = lr_of(optimizer)
    assert before == pytest.approx(BASE * 0.405)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    assert scheduler.progress == 40.5 and lr_of(optimizer) == before
    assert scheduler.get_last_lr() == [before]


def test_fractional_progress_accumulates() -> None:
    optimizer, scheduler = make(total_samples=100, kind="linear")
    for _ in range(8):
        scheduler.advance(1.25)  # e.g. AdaScale's gain-weighted progress
    assert scheduler.progress == pytest.approx(10.0)
    assert lr_of(optimizer) == pytest.approx(BASE * 0.9)


def _through_checkpoint(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_state_dict_round_trip_mid_run() -> None:
    optimizer, scheduler = make(total_samples=TOTAL, warmup_samples=WARMUP, min_lr_ratio=0.1)
    resized_run(optimizer, scheduler, [64] * 25)
    rescale_base_lrs(scheduler, 0.5)  # base lrs changed by a scaling rule must survive too
    scheduler.advance(17.5)
    state = _through_checkpoint(scheduler.state_dict())
    assert state["progress"] == 25 * 64 + 17.5
    assert state["base_lrs"] == pytest.approx([BASE / 2])

    fresh_optimizer, fresh = make(total_samples=TOTAL, warmup_samples=WARMUP, min_lr_ratio=0.1)
    fresh.load_state_dict(state)
    assert fresh.progress == scheduler.progress and fresh.base_lrs == scheduler.base_lrs
    for opt, sched in ((optimizer, scheduler), (fresh_optimizer, fresh)):
        opt.step()
        sched.advance(32)
        sched.step()
    assert lr_of(fresh_optimizer) == lr_of(optimizer)
    assert lr_of(fresh_optimizer) == pytest.approx(
        BASE / 2 * lr_multiplier(25 * 64 + 49.5, TOTAL, WARMUP, "cosine", 0.1)
    )


def test_rescale_base_lrs_keeps_the_shape() -> None:
    optimizer, scheduler = make([BASE, 0.01], total_samples=1000, warmup_samples=100)
    reference_opt, reference = make([BASE, 0.01], total_samples=1000, warmup_samples=100)
    for sched in (scheduler, reference):
        sched.advance(300)
    before = lr_of(optimizer)
    rescale_base_lrs(scheduler, 4.0)
    assert lr_of(optimizer) == pytest.approx(4 * before)  # the current LR moves at once
    assert scheduler.base_lrs == pytest.approx([4 * BASE, 0.04])
    assert [g["initial_lr"] for g in optimizer.param_groups] == pytest.approx([4 * BASE, 0.04])
    assert lr_of(optimizer, 1) == pytest.approx(4 * lr_of(reference_opt, 1))
    assert scheduler.get_last_lr() == [lr_of(optimizer), lr_of(optimizer, 1)]
    for _ in range(20):
        for sched in (scheduler, reference):
            sched.advance(50)
            sched.step()
        for group in (0, 1):
            if lr_of(reference_opt, group) > 0:
                assert lr_of(optimizer, group) / lr_of(reference_opt, group) == pytest.approx(4.0)
            else:
                assert lr_of(optimizer, group) == 0.0


@pytest.mark.parametrize("factor", [0.0, -1.0, math.inf, math.nan])
def test_rescale_rejects_bad_factor(factor: float) -> None:
    _, scheduler = make(total_samples=10)
    with pytest.raises(ValueError, match="factor must be (> 0|a finite number)"):
        rescale_base_lrs(scheduler, factor)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"total_samples": 0}, "total_samples must be > 0, got 0"),
        ({"total_samples": -5}, "total_samples must be > 0, got -5"),
        (
            {"total_samples": 10, "warmup_samples": 11},
            r"warmup_samples must be <= total_samples=10, got 11",
        ),
        ({"total_samples": 10, "warmup_samples": -1}, r"warmup_samples must be >= 0, got -1"),
        (
            {"total_samples": 10, "kind": "step"},
            r"kind must be one of \['cosine', 'linear', 'constant'\], got 'step'",
        ),
        ({"total_samples": 10, "min_lr_ratio": 1.5}, r"min_lr_ratio must be in \[0, 1\], got 1.5"),
        ({"total_samples": 10, "min_lr_ratio": -0.1}, r"min_lr_ratio must be in \[0, 1\], got -0.1"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(**kwargs)


def test_bad_progress() -> None:
    _, scheduler = make(total_samples=10)
    with pytest.raises(ValueError, match="samples"):
        scheduler.advance(-1)
    with pytest.raises(ValueError, match="got nan"):
        scheduler.set_progress(math.nan)
    with pytest.raises(ValueError, match="progress must be >= 0"):
        lr_multiplier(-1, 10)
    assert scheduler.progress == 0.0


# ----------------------------------------------------------------------------- Lightning


class _Regression(pl.LightningModule):
    def __init__(self, total: int, warmup: int) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.total, self.warmup = total, warmup

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=BASE)
        scheduler = SampleSchedule(optimizer, total_samples=self.total, warmup_samples=self.warmup)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class _AdvanceBySamples(pl.Callback):
    """Advance the schedule by the global batch after each optimizer step; record (seen, lr)."""

    def __init__(self) -> None:
        self.records: list[tuple[float, float]] = []

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int
    ) -> None:
        scheduler = trainer.lr_scheduler_configs[0].scheduler
        self.records.append((scheduler.progress, trainer.optimizers[0].param_groups[0]["lr"]))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        batch = args[1]
        trainer.lr_scheduler_configs[0].scheduler.advance(len(batch[0]) * trainer.world_size)


def test_lightning_fit_follows_the_curve(tmp_path: Any) -> None:
    data = TensorDataset(torch.randn(40, 4), torch.randn(40, 1))
    callback = _AdvanceBySamples()
    trainer = cpu_trainer(devices=1, max_steps=14, default_root_dir=tmp_path, callbacks=[callback])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(_Regression(total=80, warmup=16), DataLoader(data, batch_size=8))
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert isinstance(scheduler, SampleSchedule)
    assert scheduler.progress == 14 * 8  # across epochs (5 batches of 8 each)
    assert [seen for seen, _ in callback.records] == [8.0 * k for k in range(14)]  # advanced before each step
    for seen, lr in callback.records:
        assert lr == pytest.approx(BASE * lr_multiplier(seen, 80, 16), abs=1e-12)
    assert callback.records[1][1] == pytest.approx(BASE / 2) and callback.records[-1][1] == 0.0
    misuse = [
        str(w.message)
        for w in caught
        if "lr_scheduler" in str(w.message) or "scheduler" in str(w.message).lower()
    ]
    assert misuse == []
