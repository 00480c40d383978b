"""The elastic strategy's training data: an :class:`ElasticSampler` in place of the loader's sampler.

:func:`elastic_sampler_for` picks the sampler that keeps the loader's order (shuffled or not,
its seed) while making the data position resumable at any world size;
:func:`batches_done_this_epoch` says how many batches of the resumed epoch count as finished at
the new size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from lightning_bandlimit.strategies._lightning import loader_with_sampler
from lightning_bandlimit.strategies.elastic_sampler import ElasticSampler

__all__ = [
    "batches_done_this_epoch",
    "elastic_loader",
    "elastic_sampler_for",
    "loader_batch_size",
    "restore_position",
]


def elastic_sampler_for(
    dataloader: object, world_size: int, rank: int, seed: int | None, batch_size: int | None = None
) -> ElasticSampler:
    """The :class:`ElasticSampler` to train ``dataloader`` with on this rank.

    Args:
        dataloader: the training loader as Lightning prepared it.
        world_size: the number of processes.
        rank: this process's global rank.
        seed: the permutation seed; ``None``: a ``DistributedSampler``'s own seed, else 0.
        batch_size: the per-device micro-batch; ``None``: the loader's ``batch_size``.

    Raises:
        ValueError: for anything but a ``DataLoader`` over a map-style dataset with a
            ``batch_size`` and a random, sequential or distributed sampler.

    Example:
        >>> loader = DataLoader(list(range(10)), batch_size=2, shuffle=True)
        >>> sampler = elastic_sampler_for(loader, world_size=2, rank=1, seed=None)
        >>> sampler.shuffle, sampler.seed, len(sampler)
        (True, 0, 5)
    """
    if not isinstance(dataloader, DataLoader):
        raise ValueError(
            f"ElasticDDPStrategy needs a torch DataLoader for training to keep the data position, got "
            f"{type(dataloader).__name__}"
        )
    if isinstance(dataloader.dataset, IterableDataset):
        raise ValueError(
            "ElasticDDPStrategy needs a map-style dataset (with __len__) to keep the data position, got "
            "an IterableDataset"
        )
    if dataloader.batch_size is None:
        raise ValueError(
            "ElasticDDPStrategy needs DataLoader(batch_size=...) for training, not a custom batch_sampler"
        )
    original = dataloader.sampler
    chosen = seed if seed is not None else 0
    if type(original) is DistributedSampler:
        shuffle = original.shuffle
        chosen = original.seed if seed is None else seed
    elif isinstance(original, (RandomSampler, ElasticSampler)):
        shuffle = True if isinstance(original, RandomSampler) else original.shuffle
    elif isinstance(original, SequentialSampler):
        shuffle = False
    else:
        raise ValueError(
            f"ElasticDDPStrategy replaces the training sampler to keep the data position across resizes; "
            "it can replace RandomSampler, SequentialSampler or DistributedSampler, got "
            f"{type(original).__name__}"
        )
    return ElasticSampler(
        len(dataloader.dataset),  # type: ignore[arg-type]
        dataloader.batch_size if batch_size is None else batch_size,
        num_replicas=world_size,
        rank=rank,
        shuffle=shuffle,
        seed=chosen,
        full_epoch_len=True,
    )


def batches_done_this_epoch(sampler: ElasticSampler) -> int:
    """The batches of the current epoch a training loop must count as done at this world size.

    The loader's length is this rank's whole epoch at the current size (``full_epoch_len``) but
    it yields only what is left, so the loop must believe exactly ``whole - left`` batches are
    done, or it ends the epoch early or late.

    Example:
        >>> sampler = ElasticSampler(10, batch_size=2, num_replicas=1, rank=0, full_epoch_len=True)
        >>> sampler.advance(2)
        >>> batches_done_this_epoch(sampler)
        2
    """
    batch = sampler.batch_size
    return math.ceil(sampler.remaining(0) / batch) - math.ceil(sampler.remaining() / batch)


def restore_position(sampler: ElasticSampler, state: Mapping[str, Any] | None, path: str | None) -> None:
    """Load a saved data position (``None``: start of the run) into a new training sampler.

    Raises:
        ValueError: if ``state`` was saved with a different training set (size, seed, shuffling),
            naming the checkpoint ``path``.
    """
    if state is None:
        return
    try:
        sampler.load_state_dict(state)
    except ValueError as error:
        raise ValueError(
            f"ElasticDDPStrategy: the checkpoint {path} saved a data position in a different training set "
            f"({error}); resume with the same dataset and shuffling, or start a new run in another directory"
        ) from None


def elastic_loader(dataloader: DataLoader, sampler: ElasticSampler, batch_size: int | None) -> DataLoader:
    """``dataloader`` rebuilt around ``sampler`` (and ``batch_size``, if given), its position the sampler's.

    The loader's ``state_dict`` / ``load_state_dict`` are the sampler's: they tell Lightning the
    loader resumes mid-epoch (it warns otherwise).
    """
    loader = loader_with_sampler(dataloader, sampler, batch_size)
    loader.state_dict, loader.load_state_dict = sampler.state_dict, sampler.load_state_dict  # type: ignore[attr-defined]
    return loader


def loader_batch_size(dataloader: object) -> int:
    """The per-device batch size of the training ``dataloader``.

    Raises:
        ValueError: if it has none (pass the strategy's ``per_device_batch``).

    Example:
        >>> loader_batch_size(DataLoader(list(range(4)), batch_size=2))
        2
    """
    size = getattr(dataloader, "batch_size", None)
    if not isinstance(size, int) or size < 1:
        raise ValueError(
            "ElasticDDPStrategy could not read the per-device batch size from the training "
            f"dataloader (got {size!r}); pass per_device_batch="
        )
    return size
