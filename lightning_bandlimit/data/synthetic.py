"""Procedural 3x32x32 images whose class evidence lives in several spatial-frequency bands.

Nothing is downloaded or stored: image ``i`` of a split is rendered on the fly from a generator
seeded with ``(seed, split, i)``, so the data are identical on every machine, worker and epoch.

The generator (see :func:`render`):

* **Background**: natural-image-like ``1/f`` ("pink") noise, one random colour tint per image,
  random contrast. It carries energy at every frequency and no class information.
* **Object**: one shape (disk, bar or triangle) of random size (radius 8-11 px), position,
  rotation (bar, triangle) and colour. Its silhouette is low-frequency evidence.
* **Texture** inside the object, zero-mean so it does not move the object's average colour:
  flat, stripes of 4 cycles per image (low band), 8 cycles (mid band) or 12 cycles (high band),
  or a checkerboard of 12 cycles, each at a random orientation.
* **Noise**: Gaussian, standard deviation 0.03.

The ten classes combine shape and texture so that the evidence separating them sits in
different bands::

    0 disk flat        3 disk stripes-4     5 disk stripes-8     7 disk checker-12
    1 bar flat         4 bar stripes-4      6 bar stripes-8      8 bar checker-12
    2 triangle flat                                              9 triangle stripes-12

Dropping the high band merges 7/8/9 with 0/1/2; dropping the mid band next merges 5/6; the low
band next merges 3/4. So accuracy falls step by step as band-limiting removes more of the
spectrum, while the shapes stay recognisable until the compression is extreme.
"""

from __future__ import annotations

import functools
import math

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_bandlimit.utils.validation import check_choice, check_int

__all__ = ["CLASSES", "SyntheticImageDataModule", "SyntheticImages", "render"]

SIZE = 32
# (shape, texture kind, cycles per image)
CLASSES: tuple[tuple[str, str, float], ...] = (
    ("disk", "flat", 0.0),
    ("bar", "flat", 0.0),
    ("triangle", "flat", 0.0),
    ("disk", "stripes", 4.0),
    ("bar", "stripes", 4.0),
    ("disk", "stripes", 8.0),
    ("bar", "stripes", 8.0),
    ("disk", "checker", 12.0),
    ("bar", "checker", 12.0),
    ("triangle", "stripes", 12.0),
)
_SPLITS = {"train": 0, "val": 1, "test": 2, "predict": 3}


@functools.lru_cache(maxsize=1)
def _pink_filter() -> torch.Tensor:
    fy = torch.fft.fftfreq(SIZE).view(-1, 1)
    fx = torch.fft.rfftfreq(SIZE).view(1, -1)
    radius = torch.sqrt(fx**2 + fy**2)
    radius[0, 0] = 1.0
    return 1.0 / radius


@functools.lru_cache(maxsize=1)
def _coordinates() -> tuple[torch.Tensor, torch.Tensor]:
    coords = torch.arange(SIZE, dtype=torch.float32) + 0.5
    return torch.meshgrid(coords, coords, indexing="ij")


def _uniform(g: torch.Generator, low: float, high: float, *shape: int) -> torch.Tensor:
    return low + (high - low) * torch.rand(shape or (1,), generator=g)


def _shape_mask(kind: str, cy: float, cx: float, radius: float, angle: float) -> torch.Tensor:
    yy, xx = _coordinates()
    dy, dx = yy - cy, xx - cx
    if kind == "disk":
        return (dy**2 + dx**2 <= radius**2).float()
    c, s = math.cos(angle), math.sin(angle)
    u, v = c * dx + s * dy, -s * dx + c * dy
    if kind == "bar":
        return ((u.abs() <= radius * 1.1) & (v.abs() <= radius * 0.45)).float()
    # triangle: intersection of three half-planes around the centre
    inside = torch.ones_like(u, dtype=torch.bool)
    for k in range(3):
        a = angle + k * 2 * math.pi / 3
        inside &= (math.cos(a) * dx + math.sin(a) * dy) <= radius * 0.55
    return inside.float()


def _texture(kind: str, cycles: float, angle: float, phase: float) -> torch.Tensor:
    if kind == "flat":
        return torch.zeros(SIZE, SIZE)
    yy, xx = _coordinates()
    k = 2 * math.pi * cycles / SIZE
    u = math.cos(angle) * xx + math.sin(angle) * yy
    if kind == "stripes":
        return torch.sin(k * u + phase)
    v = -math.sin(angle) * xx + math.cos(angle) * yy
    return torch.sin(k * u + phase) * torch.sin(k * v)  # checkerboard


def render(label: int, generator: torch.Generator) -> torch.Tensor:
    """Render one image of class ``label`` (see the module docstring), in ``[0, 1]``.

    Args:
        label: class index in ``[0, 10)``.
        generator: source of all randomness for this image.

    Raises:
        TypeError: if ``label`` is not an int.
        ValueError: if ``label`` is not a class index.

    Example:
        >>> image = render(7, torch.Generator().manual_seed(0))
        >>> image.shape, bool(image.min() >= 0 and image.max() <= 1)
        (torch.Size([3, 32, 32]), True)
    """
    check_int("label", label, minimum=0, maximum=len(CLASSES) - 1)
    shape, texture, cycles = CLASSES[label]
    g = generator
    white = torch.randn(SIZE, SIZE, generator=g)
    pink = torch.fft.irfft2(torch.fft.rfft2(white) * _pink_filter(), s=(SIZE, SIZE))
    pink = (pink - pink.mean()) / (pink.std() + 1e-6)
    tint = _uniform(g, 0.2, 0.8, 3, 1, 1)
    background = tint + _uniform(g, 0.05, 0.15).item() * pink

    radius = _uniform(g, 8.0, 11.0).item()
    cy, cx = (_uniform(g, radius, SIZE - radius).item() for _ in range(2))
    angle = _uniform(g, 0.0, 2 * math.pi).item()
    mask = _shape_mask(shape, cy, cx, radius, angle)
    colour = _uniform(g, 0.35, 0.65, 3, 1, 1)
    contrast = _uniform(g, 0.25, 0.3).item()
    pattern = _texture(
        texture, cycles, _uniform(g, 0.0, math.pi).item(), _uniform(g, 0.0, 2 * math.pi).item()
    )
    foreground = colour + contrast * pattern
    image = mask * foreground + (1 - mask) * background
    image = image + 0.03 * torch.randn(3, SIZE, SIZE, generator=g)
    return image.clamp(0.0, 1.0)


class SyntheticImages(Dataset):
    """``size`` procedural images of one split; item ``i`` is ``(image, label)``, rendered on demand.

    Labels cycle through the ten classes (balanced); the rest is drawn from a generator seeded
    with ``(seed, split, i)``. Rendered images are kept in memory (``cache=True``), so later
    epochs cost nothing; the cache is filled lazily, in each DataLoader worker separately. It is
    one tensor of all the images, allocated at the first item: thousands of 12 KiB tensors
    would be scattered through the host allocator's heap among the training step's own small
    allocations, and the process's resident memory would then vary from run to run by tens of
    MiB (what the multi-tenant jobs measure against a budget).

    Args:
        size: number of images.
        seed: the data seed.
        split: ``"train"``, ``"val"``, ``"test"`` or ``"predict"``; different splits never
            share an image.
        cache: keep rendered images (``size * 12 KiB``).

    Raises:
        TypeError: if ``size`` or ``seed`` is not an int.
        ValueError: for a negative size or an unknown split.

    Example:
        >>> data = SyntheticImages(20, seed=0, split="val")
        >>> image, label = data[13]
        >>> label, torch.equal(image, data[13][0])
        (3, True)
    """

    def __init__(self, size: int, seed: int = 0, split: str = "train", cache: bool = True) -> None:
        check_int("size", size, minimum=0)
        check_int("seed", seed)
        check_choice("split", split, list(_SPLITS))
        self.size, self.seed, self.split = size, seed, split
        self.cache = cache
        self._images: torch.Tensor | None = None
        self._rendered: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not -self.size <= index < self.size:
            raise IndexError(f"index {index} out of range for {self.size} images")
        index %= self.size
        label = index % len(CLASSES)
        if self._rendered is not None and self._rendered[index]:
            return self._images[index].clone(), label  # type: ignore[index]  # a view would carry every image
        g = torch.Generator().manual_seed((self.seed * 4 + _SPLITS[self.split]) * 10_000_019 + index)
        image = render(label, g)
        if self.cache:
            if self._images is None:
                self._images = torch.empty(self.size, *image.shape, dtype=image.dtype)
                self._rendered = torch.zeros(self.size, dtype=torch.bool)
            self._images[index] = image
            self._rendered[index] = True  # type: ignore[index]
        return image, label


class SyntheticImageDataModule(pl.LightningDataModule):
    """Procedural 10-class 3x32x32 images in ``[0, 1]`` (see the module docstring): no files.

    Args:
        train_size: training images per epoch.
        val_size: validation images.
        test_size: test (and predict) images.
        batch_size: images per batch.
        seed: data seed (independent of the training seed).
        num_workers: DataLoader worker processes.

    Raises:
        TypeError: if an argument is not an int.
        ValueError: if a size is negative, ``batch_size`` is not positive or ``num_workers``
            is negative.

    Example:
        >>> dm = SyntheticImageDataModule(train_size=16, val_size=8, test_size=8, batch_size=4)
        >>> dm.setup("fit")
        >>> images, labels = next(iter(dm.train_dataloader()))
        >>> images.shape, labels.dtype
        (torch.Size([4, 3, 32, 32]), torch.int64)
    """

    def __init__(
        self,
        train_size: int = 20_000,
        val_size: int = 2_000,
        test_size: int = 2_000,
        batch_size: int = 128,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        for name, value in (("train_size", train_size), ("val_size", val_size), ("test_size", test_size)):
            check_int(name, value, minimum=0)
        check_int("batch_size", batch_size, minimum=1)
        check_int("seed", seed)
        check_int("num_workers", num_workers, minimum=0)
        self.save_hyperparameters()
        self.num_classes = len(CLASSES)

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        self.train_set = SyntheticImages(hp.train_size, hp.seed, "train")
        self.val_set = SyntheticImages(hp.val_size, hp.seed, "val")
        self.test_set = SyntheticImages(hp.test_size, hp.seed, "test")

    def _loader(self, dataset: Dataset, shuffle: bool) -> DataLoader:
        workers = self.hparams.num_workers
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            shuffle=shuffle,
            num_workers=workers,
            persistent_workers=workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, shuffle=False)
