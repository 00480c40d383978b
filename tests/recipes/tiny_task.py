"""Shared by the recipe tests: a tiny 4-class task, a linear classifier that solves it, a band filter."""

import torch
from torch import nn

from lightning_bandlimit.recipes.threats.frequency_band import band_project

CLASSES = 4


def make_data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Four classes of 3x8x8 images: a random template per class plus noise, in [0, 1]."""
    g = torch.Generator().manual_seed(1234)
    templates = torch.rand(CLASSES, 3, 8, 8, generator=g)
    g.manual_seed(seed)
    labels = torch.arange(n) % CLASSES
    images = (0.25 + 0.5 * templates[labels] + 0.05 * torch.randn(n, 3, 8, 8, generator=g)).clamp(0, 1)
    return images, labels


def fit(net: nn.Module, n: int, seed: int, steps: int, lr: float) -> nn.Module:
    """``net`` trained full-batch with Adam on ``n`` samples of :func:`make_data`, in eval mode."""
    images, labels = make_data(n, seed=seed)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(net(images), labels).backward()
        optimizer.step()
    return net.eval()


def trained_linear_classifier() -> nn.Module:
    """A linear classifier trained to ~100 % on :func:`make_data`, in eval mode."""
    torch.manual_seed(0)
    return fit(nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, CLASSES)), 256, 0, 60, 0.05)


class BandFilter(nn.Module):
    """A fixed first layer that keeps only one band of its input."""

    def __init__(self, band: tuple[float, float]) -> None:
        super().__init__()
        self.band = band

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return band_project(x, self.band)
