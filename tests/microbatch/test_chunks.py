"""A batch in chunks along its sample dimension: any collection, other leaves whole, sizes equal."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import pytest
import torch

from lightning_bandlimit.microbatch import batch_size, split_batch

Pair = namedtuple("Pair", ["x", "y"])


@dataclass
class Sample:
    x: torch.Tensor
    y: torch.Tensor
    tag: str


def _rows(parts: list) -> list[list[int]]:
    return [part[0].tolist() for part, _ in parts]


def test_a_tuple_splits_every_tensor_along_dimension_0() -> None:
    x, y = torch.arange(6), torch.arange(12).reshape(6, 2)
    parts = split_batch((x, y), 2)
    assert [count for _, count in parts] == [3, 3]
    assert torch.equal(torch.cat([p[0] for p, _ in parts]), x)
    assert torch.equal(torch.cat([p[1] for p, _ in parts]), y)
    assert all(isinstance(p, tuple) and p[1].shape == (3, 2) for p, _ in parts)


def test_sizes_are_as_equal_as_can_be_the_larger_first() -> None:
    parts = split_batch((torch.arange(16),), 3)
    assert [count for _, count in parts] == [6, 5, 5]
    assert _rows(parts) == [list(range(6)), list(range(6, 11)), list(range(11, 16))]
    assert [count for _, count in split_batch((torch.arange(7),), 4)] == [2, 2, 2, 1]


def test_a_small_batch_gives_fewer_chunks_than_asked() -> None:
    parts = split_batch((torch.arange(3),), 5)
    assert [count for _, count in parts] == [1, 1, 1]
    assert _rows(parts) == [[0], [1], [2]]
    assert len(split_batch((torch.arange(1),), 4)) == 1


def test_a_dict_keeps_its_keys_and_its_non_tensor_leaves() -> None:
    batch = {"x": torch.arange(4), "name": "cifar", "scale": 0.5}
    parts = split_batch(batch, 2)
    assert [p["x"].tolist() for p, _ in parts] == [[0, 1], [2, 3]]
    assert all(p["name"] == "cifar" and p["scale"] == 0.5 for p, _ in parts)
    assert all(set(p) == {"x", "name", "scale"} for p, _ in parts)


def test_a_namedtuple_stays_a_namedtuple() -> None:
    parts = split_batch(Pair(torch.arange(4), torch.arange(4) * 10), 2)
    assert all(type(p) is Pair for p, _ in parts)
    assert [p.y.tolist() for p, _ in parts] == [[0, 10], [20, 30]]


def test_a_dataclass_stays_a_dataclass() -> None:
    parts = split_batch(Sample(torch.arange(5), torch.ones(5, 2), "a"), 2)
    assert all(type(p) is Sample and p.tag == "a" for p, _ in parts)
    assert [p.x.tolist() for p, _ in parts] == [[0, 1, 2], [3, 4]]
    assert [p.y.shape[0] for p, _ in parts] == [3, 2]


def test_tensors_of_another_length_and_scalars_go_to_every_chunk_whole() -> None:
    weights, scalar = torch.arange(3.0), torch.tensor(2.0)
    parts = split_batch((torch.arange(4), weights, scalar, [torch.arange(4), "x"]), 2)
    for (x, w, s, (inner, tag)), count in parts:
        assert w is weights and s is scalar and tag == "x"
        assert inner.shape[0] == x.shape[0] == count == 2


def test_chunks_are_views_of_the_batch() -> None:
    x = torch.arange(6.0)
    (first, _), _ = split_batch((x, "tag"), 2)
    assert first[0].data_ptr() == x.data_ptr()  # a slice, no copy


@pytest.mark.parametrize("chunks", [0, -1, 1.5, True, "2", None])
def test_a_bad_chunk_count_is_refused(chunks: object) -> None:
    with pytest.raises(ValueError, match=r"chunks must be an int >= 1, got"):
        split_batch((torch.arange(4),), chunks)  # type: ignore[arg-type]


@pytest.mark.parametrize("batch", [{"x": 1.0}, ("a", 3), (torch.tensor(1.0),)])
def test_a_batch_without_a_sample_dimension_is_refused(batch: object) -> None:
    with pytest.raises(ValueError, match="no tensor with a sample dimension"):
        split_batch(batch, 2)


def test_one_chunk_is_the_batch_itself() -> None:
    x = torch.arange(5)
    [(part, count)] = split_batch((x,), 1)
    assert count == 5 and torch.equal(part[0], x)


def test_batch_size_is_dimension_0_of_the_first_tensor_with_one() -> None:
    assert batch_size((torch.tensor(3.0), torch.zeros(7, 2), torch.zeros(4))) == 7
    assert batch_size({"tag": "a", "x": torch.zeros(5, 1)}) == 5
    assert batch_size(Pair(torch.zeros(2), torch.zeros(9))) == 2
    assert batch_size(("a", 1.0)) is None
    assert batch_size(torch.tensor(1.0)) is None
