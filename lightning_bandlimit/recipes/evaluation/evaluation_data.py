"""The samples a robustness evaluation attacks: the first ``limit`` test samples, validated.

The data is read once, before any work, into CPU batches cloned out of inference mode (a
Lightning test loop makes inference tensors, which attacks cannot differentiate through).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

__all__ = ["Batches", "describe_data", "read_batches", "loader_of"]

#: ``(images, labels)`` batches: float images ``(N, C, H, W)`` in ``[0, 1]``, integer labels ``(N,)``.
Batches = list[tuple[torch.Tensor, torch.Tensor]]


def loader_of(data: pl.LightningDataModule | DataLoader) -> Iterable[Any]:
    """The test loader of a datamodule (prepared and set up for ``"test"``), or a loader as is.

    Raises:
        ValueError: for a datamodule with several test loaders.
        TypeError: for anything but a LightningDataModule or a DataLoader.

    Example:
        >>> loader_of([1, 2])
        Traceback (most recent call last):
        ...
        TypeError: expected a LightningDataModule or a DataLoader, got list
    """
    if isinstance(data, pl.LightningDataModule):
        data.prepare_data()
        data.setup("test")
        loader = data.test_dataloader()
        if isinstance(loader, (list, tuple)):
            if len(loader) != 1:
                raise ValueError(
                    f"expected one test dataloader from {type(data).__name__}, got {len(loader)}"
                )
            loader = loader[0]
        return loader
    if isinstance(data, DataLoader):
        return data
    raise TypeError(f"expected a LightningDataModule or a DataLoader, got {type(data).__name__}")


def _describe_tensor(value: Any) -> str:
    return f"{value.dtype} {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__


def _check_batch(batch: Any, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(batch, (list, tuple)) or len(batch) < 2:
        raise ValueError(f"expected batches of (images, labels), got {type(batch).__name__} in batch {index}")
    images, labels = batch[0], batch[1]
    if not isinstance(images, torch.Tensor) or not images.is_floating_point() or images.dim() != 4:
        raise ValueError(
            f"expected float images of shape (N, C, H, W), got {_describe_tensor(images)} in batch {index}"
        )
    if (
        not isinstance(labels, torch.Tensor)
        or labels.dim() != 1
        or len(labels) != len(images)
        or (labels.is_floating_point() or labels.is_complex())
    ):
        raise ValueError(
            f"expected integer labels of shape ({len(images)},), got {_describe_tensor(labels)} "
            f"in batch {index}"
        )
    return images, labels


def read_batches(data: pl.LightningDataModule | DataLoader, limit: int | None, seed: int) -> Batches:
    """The first ``limit`` samples (all if ``None``) as CPU batches, cloned and validated.

    Shuffling loaders draw their order from the global RNG: it is seeded with ``seed`` on a
    fork, so the caller's RNG state is left alone.

    Raises:
        ValueError: for batches that are not ``(images, labels)``, images outside ``[0, 1]``,
            or no sample at all.
        TypeError: for ``data`` of another type.

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> loader = DataLoader(TensorDataset(torch.rand(5, 1, 2, 2), torch.arange(5)), batch_size=2)
        >>> [len(y) for _, y in read_batches(loader, limit=3, seed=0)]
        [2, 1]
    """
    batches: Batches = []
    count = 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for index, batch in enumerate(loader_of(data)):
            images, labels = _check_batch(batch, index)
            if limit is not None:
                images, labels = images[: limit - count], labels[: limit - count]
            if len(images) == 0:
                continue
            low, high = images.min().item(), images.max().item()
            if not (0.0 <= low and high <= 1.0):  # also catches NaN
                raise ValueError(
                    f"expected images in [0, 1] (normalisation belongs inside the model), got values in "
                    f"[{low:.4g}, {high:.4g}] in batch {index}"
                )
            batches.append((images.detach().clone(), labels.detach().clone().long()))
            count += len(images)
            if limit is not None and count >= limit:
                break
    if not batches:
        raise ValueError("expected at least one sample from the data, got none")
    return batches


def describe_data(data: Any, n: int, batches: int) -> dict[str, Any]:
    """What ``results.json`` records about the data: class, samples, batches, hyperparameters.

    Example:
        >>> describe_data([], 4, 1)
        {'class': 'builtins.list', 'samples': 4, 'batches': 1}
    """
    description: dict[str, Any] = {
        "class": f"{type(data).__module__}.{type(data).__qualname__}",
        "samples": n,
        "batches": batches,
    }
    hparams = getattr(data, "hparams", None)
    if hparams:
        description["hparams"] = dict(hparams)
    if isinstance(data, DataLoader):
        description["dataset"] = type(data.dataset).__name__
        description["batch_size"] = data.batch_size
    return description
