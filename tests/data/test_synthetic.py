"""SyntheticImageDataModule: deterministic, balanced, class evidence in several bands."""

import pytest
import torch

from lightning_bandlimit.data import CLASSES, SyntheticImageDataModule, SyntheticImages, render


def _band_energy(images: torch.Tensor, low: float, high: float) -> float:
    """Mean spectral energy of images (mean removed) at radial frequencies in [low, high) cycles."""
    spec = torch.fft.fft2(images - images.mean(dim=(-2, -1), keepdim=True)).abs() ** 2
    fy = torch.fft.fftfreq(32).view(-1, 1) * 32
    fx = torch.fft.fftfreq(32).view(1, -1) * 32
    radius = torch.sqrt(fx**2 + fy**2)
    mask = (radius >= low) & (radius < high)
    return spec[..., mask].mean().item()


def test_deterministic_balanced_and_in_range() -> None:
    a, b = SyntheticImages(40, seed=1, split="train"), SyntheticImages(40, seed=1, split="train", cache=False)
    assert all(torch.equal(a[i][0], b[i][0]) for i in range(0, 40, 7))
    other_seed, other_split = SyntheticImages(40, seed=2), SyntheticImages(40, seed=1, split="val")
    assert not torch.equal(a[3][0], other_seed[3][0]) and not torch.equal(a[3][0], other_split[3][0])
    labels = torch.tensor([a[i][1] for i in range(40)])
    assert torch.bincount(labels).tolist() == [4] * 10
    images = torch.stack([a[i][0] for i in range(40)])
    assert images.shape == (40, 3, 32, 32) and images.min() >= 0 and images.max() <= 1


def test_cached_images_are_served_as_their_own_copies() -> None:
    data = SyntheticImages(30, seed=0)
    first, _ = data[-1]
    again, _ = data[29]
    assert torch.equal(first, again) and again.data_ptr() != first.data_ptr()
    # an item never carries the cache's storage (torch.save would write every image)
    assert again.untyped_storage().nbytes() == first.numel() * first.element_size() == 3 * 32 * 32 * 4
    again.zero_()
    assert torch.equal(data[29][0], first)  # a caller writing into its copy leaves the cache alone


@pytest.mark.parametrize(("textured", "flat", "band"), [(9, 2, (11, 14)), (5, 0, (7, 10)), (3, 0, (3, 5))])
def test_texture_classes_carry_energy_in_their_band(textured: int, flat: int, band: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(0)
    tex = torch.stack([render(textured, g) for _ in range(16)])
    plain = torch.stack([render(flat, g) for _ in range(16)])
    assert _band_energy(tex, *band) > 3 * _band_energy(plain, *band)


def test_class_table_and_bad_input() -> None:
    assert len(CLASSES) == 10 and len(set(CLASSES)) == 10
    with pytest.raises(ValueError, match="label must be in"):
        render(10, torch.Generator())
    with pytest.raises(ValueError, match="split must be one of"):
        SyntheticImages(4, split="holdout")
    with pytest.raises(IndexError):
        SyntheticImages(4)[4]
    with pytest.raises(ValueError, match="batch_size"):
        SyntheticImageDataModule(batch_size=0)
    with pytest.raises(ValueError, match=r"label must be in \[0, 9\], got 10"):
        render(10, torch.Generator())
    with pytest.raises(ValueError, match="size must be >= 0, got -1"):
        SyntheticImages(-1)
    with pytest.raises(ValueError, match="val_size must be >= 0, got -2"):
        SyntheticImageDataModule(val_size=-2)
    with pytest.raises(TypeError, match="train_size must be an int >= 0, got 2.5"):
        SyntheticImageDataModule(train_size=2.5)  # type: ignore[arg-type]


def test_datamodule_loaders() -> None:
    dm = SyntheticImageDataModule(train_size=20, val_size=10, test_size=10, batch_size=5)
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (5, 3, 32, 32) and images.dtype == torch.float32 and labels.dtype == torch.int64
    assert sum(len(b[1]) for b in dm.val_dataloader()) == 10
    assert dm.num_classes == 10
