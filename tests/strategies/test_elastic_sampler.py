"""ElasticSampler: one global order per epoch, resumable mid-epoch at any world size."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, TensorDataset

from lightning_bandlimit.strategies.elastic_sampler import ElasticSampler


def samplers(world: int, dataset_size: int, batch_size: int, **kwargs: object) -> list[ElasticSampler]:
    return [
        ElasticSampler(dataset_size, batch_size, num_replicas=world, rank=r, **kwargs)  # type: ignore[arg-type]
        for r in range(world)
    ]


def run_steps(group: list[ElasticSampler], steps: int) -> list[int]:
    """Indices all ranks yield over ``steps`` global steps; then advance every rank."""
    seen: list[int] = []
    for sampler in group:
        seen.extend(itertools.islice(iter(sampler), steps * sampler.batch_size))
    for sampler in group:
        sampler.advance(steps)
    return seen


def rest_of_epoch(group: list[ElasticSampler]) -> list[int]:
    return [i for sampler in group for i in sampler]


def resume(
    state: dict, world: int, dataset_size: int, batch_size: int, **kwargs: object
) -> list[ElasticSampler]:
    group = samplers(world, dataset_size, batch_size, **kwargs)
    for sampler in group:
        sampler.load_state_dict(state)
    return group


def epoch_after_resize(
    dataset_size: int,
    batch_before: int,
    world_before: int,
    steps: int,
    world_after: int,
    batch_after: int,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
) -> Counter[int]:
    before = samplers(world_before, dataset_size, batch_before, shuffle=shuffle, seed=seed)
    for sampler in before:
        sampler.set_epoch(epoch)
    seen = run_steps(before, steps)
    states = [s.state_dict() for s in before]
    assert all(state == states[0] for state in states), "ranks disagree on the position"
    after = resume(states[0], world_after, dataset_size, batch_after, shuffle=shuffle, seed=seed)
    for sampler in after:
        sampler.set_epoch(epoch)  # same epoch, as Lightning does after a restore: position kept
    return Counter(seen + rest_of_epoch(after))


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(
    ("dataset_size", "batch_size", "steps"),
    [(64, 8, 2), (100, 8, 3), (37, 4, 1), (10, 3, 1), (23, 5, 2), (7, 2, 0)],
)
@pytest.mark.parametrize(("world_before", "world_after"), [(2, 1), (1, 2), (2, 3), (3, 2)])
def test_resize_covers_epoch_exactly_once(
    dataset_size: int, batch_size: int, steps: int, world_before: int, world_after: int, shuffle: bool
) -> None:
    counts = epoch_after_resize(
        dataset_size, batch_size, world_before, steps, world_after, batch_size, shuffle
    )
    assert sorted(counts) == list(range(dataset_size))
    assert set(counts.values()) == {1}


def test_resize_with_a_different_per_device_batch() -> None:
    counts = epoch_after_resize(101, batch_before=6, world_before=2, steps=4, world_after=3, batch_after=5)
    assert sorted(counts) == list(range(101)) and max(counts.values()) == 1


def test_resume_continues_the_same_global_order() -> None:
    """The resumed part is exactly the tail of the epoch's permutation, re-partitioned."""
    before = samplers(2, 50, 4, seed=7)
    run_steps(before, 3)
    (alone,) = resume(before[0].state_dict(), 1, 50, 4, seed=7)
    assert alone.consumed == 24
    assert list(alone) == before[0].permutation()[24:]


def test_partition_within_a_global_step() -> None:
    group = samplers(3, 20, 2, shuffle=False)
    per_rank = [list(s) for s in group]
    # steps of 6: rank r takes [6s + 2r, 6s + 2r + 2); tail 18, 19 -> ranks 0, 1; rank 2 gets nothing
    assert per_rank == [[0, 1, 6, 7, 12, 13, 18], [2, 3, 8, 9, 14, 15, 19], [4, 5, 10, 11, 16, 17]]


def test_tail_chunks_are_contiguous_and_near_equal() -> None:
    # 2 full steps of 8, then a tail of 7 over 4 ranks: 2, 2, 2, 1
    group = samplers(4, 23, 2, shuffle=False)
    tails = [list(s)[4:] for s in group]
    assert tails == [[16, 17], [18, 19], [20, 21], [22]]
    group = samplers(3, 13, 4, shuffle=False)  # one full step of 12, tail of 1
    assert [len(s) for s in group] == [5, 4, 4]


def test_len_matches_iteration() -> None:
    for world, rank, size, batch, steps in itertools.product(
        [1, 2, 3], range(3), [0, 1, 5, 17, 64], [1, 3, 8], [0, 1, 2, 9]
    ):
        if rank >= world:
            continue
        sampler = ElasticSampler(size, batch, num_replicas=world, rank=rank, seed=1)
        sampler.advance(steps)
        assert len(sampler) == len(list(sampler)), (world, rank, size, batch, steps)


def test_iterator_is_fixed_when_created() -> None:
    sampler = ElasticSampler(12, 2, num_replicas=1, rank=0, shuffle=False)
    iterator = iter(sampler)
    sampler.advance(3)  # the training loop advances while the loader still iterates
    assert list(iterator) == list(range(12))
    assert list(sampler) == list(range(6, 12))


def test_epochs_and_seeds() -> None:
    a = ElasticSampler(200, 4, num_replicas=1, rank=0, seed=3)
    b = ElasticSampler(200, 4, num_replicas=1, rank=0, seed=3)
    first = list(a)
    assert first == list(b) and sorted(first) == list(range(200)) and first != list(range(200))
    a.set_epoch(1)
    second = list(a)
    assert second != first and sorted(second) == list(range(200))
    b.set_epoch(1)
    assert list(b) == second
    other_seed = ElasticSampler(200, 4, num_replicas=1, rank=0, seed=4)
    assert list(other_seed) != first


def test_unshuffled_is_identity_in_every_epoch() -> None:
    sampler = ElasticSampler(9, 2, num_replicas=1, rank=0, shuffle=False)
    sampler.set_epoch(5)
    assert list(sampler) == list(range(9))


def test_set_epoch_resets_position_only_when_epoch_changes() -> None:
    sampler = ElasticSampler(40, 4, num_replicas=2, rank=0)
    sampler.advance(2)
    sampler.set_epoch(0)
    assert sampler.consumed == 16
    sampler.set_epoch(1)
    assert sampler.consumed == 0
    sampler.advance(1)
    sampler.set_epoch(1)
    assert sampler.consumed == 8


def test_advance_caps_at_dataset_size() -> None:
    sampler = ElasticSampler(10, 4, num_replicas=2, rank=1)
    sampler.advance(5)
    assert sampler.consumed == 10 and len(sampler) == 0 and list(sampler) == []


def test_state_dict_contents_and_round_trip() -> None:
    sampler = ElasticSampler(30, 2, num_replicas=3, rank=2, seed=11, shuffle=True)
    sampler.set_epoch(4)
    sampler.advance(2)
    state = sampler.state_dict()
    assert state == {"epoch": 4, "consumed": 12, "seed": 11, "dataset_size": 30, "shuffle": True}
    loaded = torch.load(_save(state), weights_only=True)  # survives a checkpoint
    fresh = ElasticSampler(30, 5, num_replicas=2, rank=0, seed=11)
    fresh.load_state_dict(loaded)
    assert (fresh.epoch, fresh.consumed) == (4, 12)


def _save(obj: object) -> object:
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dataset_size": 31}, "dataset_size mismatch: this sampler has 30, the state has 31"),
        ({"seed": 12}, "seed mismatch: this sampler has 0, the state has 12"),
        ({"shuffle": False}, "shuffle mismatch: this sampler has True, the state has False"),
        ({"consumed": 31}, "consumed must be <= dataset_size=30, got 31"),
        ({"consumed": -1}, "consumed must be >= 0, got -1"),
        ({"epoch": -2}, "epoch must be >= 0, got -2"),
    ],
)
def test_load_state_dict_rejects_mismatch(change: dict, message: str) -> None:
    state = {**ElasticSampler(30, 2, num_replicas=1, rank=0).state_dict(), **change}
    sampler = ElasticSampler(30, 2, num_replicas=2, rank=0)
    sampler.advance(1)
    with pytest.raises(ValueError, match=message):
        sampler.load_state_dict(state)
    assert sampler.consumed == 4  # unchanged by a rejected state


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset_size": -1}, "dataset_size must be >= 0, got -1"),
        ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
        ({"num_replicas": 0}, "num_replicas must be >= 1, got 0"),
        ({"rank": 2, "num_replicas": 2}, r"rank in \[0, 2\) for num_replicas=2, got 2"),
        ({"rank": -1}, "rank must be >= 0, got -1"),
    ],
)
def test_constructor_validation(kwargs: dict, message: str) -> None:
    args = {"dataset_size": 10, "batch_size": 2, "num_replicas": 1, "rank": 0, **kwargs}
    with pytest.raises(ValueError, match=message):
        ElasticSampler(args.pop("dataset_size"), args.pop("batch_size"), **args)


@pytest.mark.parametrize("kwargs", [{"batch_size": 2.0}, {"dataset_size": True}, {"rank": "0"}])
def test_constructor_rejects_non_integers(kwargs: dict) -> None:
    args = {"dataset_size": 10, "batch_size": 2, "num_replicas": 1, "rank": 0, **kwargs}
    with pytest.raises(TypeError, match=next(iter(kwargs))):
        ElasticSampler(args.pop("dataset_size"), args.pop("batch_size"), **args)


def test_advance_and_set_epoch_reject_negatives() -> None:
    sampler = ElasticSampler(10, 2, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="steps"):
        sampler.advance(-1)
    with pytest.raises(ValueError, match="epoch"):
        sampler.set_epoch(-1)


def test_defaults_without_process_group() -> None:
    sampler = ElasticSampler(10, 2)
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle, sampler.seed) == (1, 0, True, 0)
    assert sorted(sampler) == list(range(10))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_batches(num_workers: int) -> None:
    data = TensorDataset(torch.arange(22))
    group = samplers(2, 22, 4, seed=5)
    perm = group[0].permutation()
    group[0].advance(1)
    group[1].advance(1)
    loaders = [DataLoader(data, batch_size=4, sampler=s, num_workers=num_workers) for s in group]
    batches = [[b[0].tolist() for b in loader] for loader in loaders]
    # after one step of 8: one full step (8..15), then a tail of 6 split 3 | 3
    assert batches[0] == [perm[8:12], perm[16:19]]
    assert batches[1] == [perm[12:16], perm[19:22]]
    assert [len(loader) for loader in loaders] == [2, 2]


@settings(max_examples=150, deadline=None)
@given(
    dataset_size=st.integers(0, 120),
    batch_before=st.integers(1, 9),
    batch_after=st.integers(1, 9),
    world_before=st.integers(1, 5),
    world_after=st.integers(1, 5),
    steps=st.integers(0, 40),
    shuffle=st.booleans(),
    seed=st.integers(0, 1000),
    epoch=st.integers(0, 3),
)
def test_property_any_resize_covers_epoch_exactly_once(
    dataset_size: int,
    batch_before: int,
    batch_after: int,
    world_before: int,
    world_after: int,
    steps: int,
    shuffle: bool,
    seed: int,
    epoch: int,
) -> None:
    counts = epoch_after_resize(
        dataset_size, batch_before, world_before, steps, world_after, batch_after, shuffle, seed, epoch
    )
    assert sorted(counts) == list(range(dataset_size))
    assert all(n == 1 for n in counts.values())
    # each rank's length is what it yields, and ranks' tail shares differ by at most one sample
    after = samplers(world_after, dataset_size, batch_after, shuffle=shuffle, seed=seed)
    lengths = [len(s) for s in after]
    assert lengths == [len(list(s)) for s in after]
    assert max(lengths) - min(lengths) <= 1 and sum(lengths) == dataset_size


def test_full_epoch_len_counts_the_whole_epoch_but_yields_the_rest() -> None:
    sampler = ElasticSampler(10, batch_size=2, num_replicas=2, rank=0, shuffle=False, full_epoch_len=True)
    sampler.advance(1)
    assert len(sampler) == sampler.remaining(0) == 5 and sampler.remaining() == 3
    assert list(sampler) == [4, 5, 8]
