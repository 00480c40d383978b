"""ExactGlobalBatch: the plan per world size, checked against brute force."""

from __future__ import annotations

import itertools

import pytest

from lightning_bandlimit.strategies import ExactGlobalBatch, MicroBatchPlan, TrainingConfig


def _brute_force(global_batch: int, micro: list[int], max_acc: int, world: int) -> list[tuple[int, int]]:
    return [
        (m, a) for m, a in itertools.product(micro, range(1, max_acc + 1)) if world * m * a == global_batch
    ]


@pytest.mark.parametrize(
    ("global_batch", "micro", "max_acc"),
    [(128, [32, 64], 64), (96, [8, 12, 16], 4), (60, [1, 2, 3, 4, 5], 3), (256, [48], 64)],
)
def test_plans_are_exact_and_valid_sizes_match_brute_force(
    global_batch: int, micro: list[int], max_acc: int
) -> None:
    if not any(_brute_force(global_batch, micro, max_acc, w) for w in range(1, 17)):
        with pytest.raises(ValueError, match="no world size up to 16"):
            ExactGlobalBatch(global_batch, micro_batches=micro, max_accumulation=max_acc, max_world_size=16)
        return
    rule = ExactGlobalBatch(global_batch, micro_batches=micro, max_accumulation=max_acc, max_world_size=16)
    valid = []
    for world in range(1, 17):
        solutions = _brute_force(global_batch, micro, max_acc, world)
        if not solutions:
            with pytest.raises(ValueError, match=f"on {world} processes"):
                rule.plan(world)
            continue
        valid.append(world)
        plan = rule.plan(world)
        assert plan.exact and plan.global_batch == global_batch
        assert plan.micro_batch == max(m for m, _ in solutions)  # the largest micro-batch wins
    assert rule.valid_world_sizes() == valid


def test_max_micro_batch_allows_every_size_up_to_it() -> None:
    rule = ExactGlobalBatch(120, max_micro_batch=40, max_world_size=8)
    assert rule.plan(3) == MicroBatchPlan(3, 40, 1)
    assert rule.plan(8) == MicroBatchPlan(8, 15, 1)
    with pytest.raises(ValueError, match=r"no micro-batch in 1\.\.40 .* on 7 processes"):
        rule.plan(7)
    assert rule.valid_world_sizes() == [
        w for w in range(1, 9) if any(120 % (w * m) == 0 for m in range(1, 41))
    ]


def test_refusal_names_the_valid_world_sizes() -> None:
    rule = ExactGlobalBatch(128, micro_batches=[32, 64])
    with pytest.raises(ValueError, match=r"valid world sizes: \[1, 2, 4\].*fallback=True"):
        rule.adjust(TrainingConfig(world_size=1, per_device_batch=64, accumulation=2), world_size=3)


def test_adjust_keeps_hyperparameters_on_an_exact_plan() -> None:
    reference = TrainingConfig(world_size=1, per_device_batch=64, accumulation=2, lr=0.2, momentum=0.9)
    rule = ExactGlobalBatch(128, micro_batches=[32, 64])
    for world in (1, 2, 4):
        new = rule.adjust(reference, world)
        assert new.global_batch == 128 and new.lr == 0.2 and new.momentum == 0.9
        assert (new.world_size, new.per_device_batch * new.accumulation * world) == (world, 128)


def test_fallback_takes_the_nearest_global_batch_and_rescales_the_lr_linearly() -> None:
    reference = TrainingConfig(world_size=1, per_device_batch=64, accumulation=2, lr=0.2)
    rule = ExactGlobalBatch(128, micro_batches=[32, 64], fallback=True)
    new = rule.adjust(reference, 3)
    assert (new.per_device_batch, new.accumulation, new.global_batch) == (32, 1, 96)
    assert new.lr == pytest.approx(0.2 * 96 / 128)
    assert rule.adjust(reference, 3, damping=0.0).lr == 0.2
    assert rule.adjust(reference, 3, damping=0.5).lr == pytest.approx(0.2 * (96 / 128) ** 0.5)
    assert rule.plan(3).exact is False and rule.plan(4).exact is True


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"global_batch": 0, "micro_batches": [1]}, ValueError, "global_batch"),
        ({"global_batch": 8.0, "micro_batches": [1]}, TypeError, "global_batch"),
        ({"global_batch": 8}, ValueError, "max_micro_batch"),
        ({"global_batch": 8, "micro_batches": [2], "max_micro_batch": 4}, ValueError, "max_micro_batch"),
        ({"global_batch": 8, "micro_batches": []}, ValueError, "micro_batches"),
        ({"global_batch": 8, "micro_batches": [0]}, ValueError, "micro_batches"),
        ({"global_batch": 7, "micro_batches": [2]}, ValueError, "no world size up to 64 .* exactly 7"),
    ],
)
def test_bad_arguments(kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ExactGlobalBatch(**kwargs)


def test_bad_damping_and_world_size() -> None:
    rule = ExactGlobalBatch(8, micro_batches=[2])
    reference = TrainingConfig(world_size=1, per_device_batch=2, accumulation=4)
    with pytest.raises(ValueError, match="damping"):
        rule.adjust(reference, 2, damping=1.5)
    with pytest.raises(ValueError, match="world_size"):
        rule.plan(0)
