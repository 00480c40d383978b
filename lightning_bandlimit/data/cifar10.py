"""CIFAR-10 for Lightning: :class:`CIFAR10DataModule` over a local copy of the python batches.

Never downloads. The files are found and read by :mod:`lightning_bandlimit.data.cifar10_batches`;
images become float32 in ``[0, 1]`` and the training
images are augmented with :mod:`torchvision.transforms.v2` (:func:`cifar10_transform`).

Example:
    >>> import tempfile
    >>> from lightning_bandlimit.data.cifar10_batches import write_fake_cifar10
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     root = write_fake_cifar10(tmp, n_train_per_batch=4, n_test=6)
    ...     dm = CIFAR10DataModule(tmp, batch_size=4, val_size=5)
    ...     dm.setup("fit")
    ...     images, labels = next(iter(dm.train_dataloader()))
    >>> len(dm.train_set), len(dm.val_set)
    (15, 5)
    >>> images.shape, images.dtype, labels.dtype
    (torch.Size([4, 3, 32, 32]), torch.float32, torch.int64)
    >>> bool(images.min() >= 0 and images.max() <= 1)
    True
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from lightning_bandlimit.data.cifar10_batches import (
    CIFAR10_CLASSES,
    CIFAR10_TEST_FILE,
    CIFAR10_TRAIN_FILES,
    load_cifar10_batches,
    load_cifar10_classes,
    resolve_cifar10_dir,
)
from lightning_bandlimit.utils.validation import check_choice, check_int

__all__ = ["CIFAR10DataModule", "CIFAR10Split", "cifar10_transform"]

_STAGES = (None, "fit", "validate", "test", "predict")


def cifar10_transform(augment: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """uint8 ``(3, 32, 32)`` image -> float32 in ``[0, 1]``, augmented if ``augment``.

    The augmentation is the standard CIFAR one: a random 32x32 crop of the image zero-padded
    by 4 pixels, then a random horizontal flip (``torchvision.transforms.v2``; drawn from
    torch's global RNG, so ``lightning.seed_everything`` makes it reproducible).

    Example:
        >>> image = torch.full((3, 32, 32), 255, dtype=torch.uint8)
        >>> out = cifar10_transform(augment=False)(image)
        >>> out.dtype, float(out.max())
        (torch.float32, 1.0)
        >>> cropped = cifar10_transform(augment=True)(image)
        >>> cropped.shape, float(cropped.min()) in (0.0, 1.0)
        (torch.Size([3, 32, 32]), True)
    """
    to_float = v2.ToDtype(torch.float32, scale=True)
    if not augment:
        return to_float
    return v2.Compose([v2.RandomCrop(32, padding=4, fill=0), v2.RandomHorizontalFlip(), to_float])


class CIFAR10Split(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A view of CIFAR-10 images yielding ``(float image in [0, 1] (3, 32, 32), int64 label)``.

    Args:
        images: uint8 tensor ``(N, 3, 32, 32)`` (shared, not copied).
        labels: int64 tensor ``(N,)``.
        indices: which rows of ``images`` this split holds (default: all, in order).
        augment: random 32x32 crop of the image zero-padded by 4 pixels, then a random
            horizontal flip (see :func:`cifar10_transform`).

    Example:
        >>> split = CIFAR10Split(torch.full((2, 3, 32, 32), 255, dtype=torch.uint8), torch.tensor([3, 7]))
        >>> image, label = split[1]
        >>> image.shape, float(image.max()), int(label)
        (torch.Size([3, 32, 32]), 1.0, 7)
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        indices: torch.Tensor | Sequence[int] | None = None,
        augment: bool = False,
    ) -> None:
        if images.dtype != torch.uint8 or images.shape[1:] != (3, 32, 32):
            raise ValueError(f"images must be uint8 (N, 3, 32, 32), got {images.dtype} {tuple(images.shape)}")
        if labels.shape != (len(images),):
            raise ValueError(f"labels must have shape ({len(images)},), got {tuple(labels.shape)}")
        self.images = images
        self.labels = labels.to(torch.int64)
        self.indices = (
            torch.arange(len(images)) if indices is None else torch.as_tensor(indices, dtype=torch.int64)
        )
        self.augment = augment
        self.transform = cifar10_transform(augment)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.indices[index]
        return self.transform(self.images[row]), self.labels[row]


class CIFAR10DataModule(pl.LightningDataModule):
    """CIFAR-10 from a local folder of python batches, as float images in ``[0, 1]``.

    Splits: ``train`` is ``data_batch_1`` .. ``data_batch_5`` minus ``val_size`` images held
    out for ``val`` (chosen by a permutation seeded with ``seed``, so the split is the same on
    every run and every process); ``test`` and ``predict`` are ``test_batch``. Batches are
    ``(images, labels)`` with images float32 ``(B, 3, 32, 32)`` in ``[0, 1]`` (not normalised:
    that belongs to the model) and labels int64 ``(B,)``. With ``augment=True`` the training
    images are randomly cropped from a 4-pixel zero padding and randomly flipped horizontally;
    the other splits are never augmented.

    Nothing is ever downloaded: :meth:`prepare_data` only checks that the files are there and
    :meth:`setup` reads and validates them.

    Args:
        data_dir: the folder that contains ``cifar-10-batches-py/``, or that folder itself.
        batch_size: images per batch (>= 1).
        val_size: training images held out for validation (>= 0, fewer than the training set).
        num_workers: data loader worker processes (>= 0); workers are persistent when > 0.
        augment: random crop and horizontal flip of the training images.
        seed: seed of the train/validation split.
        pin_memory: passed to the data loaders.

    Raises:
        TypeError: an integer argument is not an int.
        ValueError: ``batch_size < 1``, ``val_size < 0`` or ``num_workers < 0``.

    Example:
        >>> import tempfile
        >>> from lightning_bandlimit.data.cifar10_batches import write_fake_cifar10
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     folder = write_fake_cifar10(tmp, n_train_per_batch=4, n_test=6)
        ...     dm = CIFAR10DataModule(folder, batch_size=3, val_size=2, augment=False)
        ...     dm.setup()
        >>> len(dm.train_set), len(dm.val_set), len(dm.test_set), len(dm.predict_set)
        (18, 2, 6, 6)
        >>> dm.classes[:2]
        ('airplane', 'automobile')
    """

    num_classes: int = len(CIFAR10_CLASSES)
    image_shape: tuple[int, int, int] = (3, 32, 32)

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        batch_size: int = 128,
        val_size: int = 5000,
        num_workers: int = 0,
        augment: bool = True,
        seed: int = 0,
        pin_memory: bool = False,
    ) -> None:
        super().__init__()
        check_int("batch_size", batch_size, minimum=1)
        check_int("val_size", val_size, minimum=0)
        check_int("num_workers", num_workers, minimum=0)
        check_int("seed", seed)
        self.save_hyperparameters()
        self.data_dir = Path(data_dir)
        self.batch_size = batch_size
        self.val_size = val_size
        self.num_workers = num_workers
        self.augment = augment
        self.seed = seed
        self.pin_memory = pin_memory
        self.train_set: CIFAR10Split | None = None
        self.val_set: CIFAR10Split | None = None
        self.test_set: CIFAR10Split | None = None
        self.predict_set: CIFAR10Split | None = None
        self._classes: tuple[str, ...] | None = None

    @property
    def classes(self) -> tuple[str, ...]:
        """The 10 class names, from ``batches.meta`` when present, else the standard names.

        Raises:
            ValueError: ``batches.meta`` exists but is malformed.
        """
        if self._classes is None:
            try:
                self._classes = load_cifar10_classes(self.data_dir)
            except FileNotFoundError:
                return CIFAR10_CLASSES
        return self._classes

    def prepare_data(self) -> None:
        """Check that the batch files exist (never downloads).

        Raises:
            FileNotFoundError: the folder or one of the batch files is missing.
        """
        resolve_cifar10_dir(self.data_dir)

    def setup(self, stage: str | None = None) -> None:
        """Read, validate and split the batches the stage needs.

        Args:
            stage: ``"fit"`` (train and val), ``"validate"`` (val), ``"test"``, ``"predict"``,
                or ``None`` for all.

        Raises:
            FileNotFoundError: the folder or one of the batch files is missing.
            ValueError: a file is malformed, ``val_size`` is not smaller than the number of
                training images, or ``stage`` is unknown.
        """
        check_choice("stage", stage, _STAGES)
        want_train = stage in (None, "fit", "validate") and self.train_set is None
        want_test = stage in (None, "test", "predict") and self.test_set is None
        names = [*(CIFAR10_TRAIN_FILES if want_train else ()), *((CIFAR10_TEST_FILE,) if want_test else ())]
        batches = load_cifar10_batches(self.data_dir, names) if names else {}
        if self._classes is None:
            self._classes = load_cifar10_classes(self.data_dir)
        if want_train:
            images = torch.cat([batches[name][0] for name in CIFAR10_TRAIN_FILES])
            labels = torch.cat([batches[name][1] for name in CIFAR10_TRAIN_FILES])
            if self.val_size >= len(images):
                raise ValueError(
                    f"val_size must be smaller than the {len(images)} training images in "
                    f"{resolve_cifar10_dir(self.data_dir)}, got val_size={self.val_size}"
                )
            order = torch.randperm(len(images), generator=torch.Generator().manual_seed(self.seed))
            val_indices = order[: self.val_size].sort().values
            train_indices = order[self.val_size :].sort().values
            self.train_set = CIFAR10Split(images, labels, train_indices, augment=self.augment)
            self.val_set = CIFAR10Split(images, labels, val_indices, augment=False)
        if want_test:
            images, labels = batches[CIFAR10_TEST_FILE]
            self.test_set = CIFAR10Split(images, labels, augment=False)
            self.predict_set = CIFAR10Split(images, labels, augment=False)

    def _loader(self, dataset: CIFAR10Split | None, stage: str, shuffle: bool) -> DataLoader:
        if dataset is None:
            raise RuntimeError(f"call setup({stage!r}) before asking for its data loader")
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            drop_last=False,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        """Shuffled (augmented if ``augment``) training batches; call ``setup("fit")`` first."""
        return self._loader(self.train_set, "fit", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        """Held-out validation batches in a fixed order; call ``setup("fit")`` first."""
        return self._loader(self.val_set, "fit", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        """``test_batch`` in file order; call ``setup("test")`` first."""
        return self._loader(self.test_set, "test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        """``test_batch`` in file order, as ``(images, labels)``; call ``setup("predict")`` first."""
        return self._loader(self.predict_set, "predict", shuffle=False)
