"""Fourier heat maps (Yin et al., NeurIPS 2019, "A Fourier Perspective on Model Robustness").

For every 2-D frequency ``(i, j)`` the test images are perturbed by ``X + r * eps * U_ij``, where
``U_ij`` is the real, unit-L2-norm image whose spectrum is supported on ``(i, j)`` and its
Hermitian mirror ``(-i, -j)``, and ``r = +-1`` is a random sign per image and per channel; the
result is clipped to ``[0, 1]`` and the error rate recorded. ``U_ij == U_{-i,-j}``, so only one bin
of each mirrored pair is evaluated (about ``H * (W // 2 + 1)`` bins) and the map is exactly
point-symmetric. The map is returned centred (DC in the middle, :func:`torch.fft.fftshift`).
The paper uses ``eps = 4`` on CIFAR-10.
"""

from __future__ import annotations

import math
from os import PathLike
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["fourier_basis", "fourier_heat_map", "save_heat_map", "save_heat_map_difference"]


def _check_bin(height: int, width: int, i: int, j: int) -> None:
    check_int("height", height, minimum=1)
    check_int("width", width, minimum=1)
    check_int("i", i, minimum=0, maximum=height - 1)
    check_int("j", j, minimum=0, maximum=width - 1)


def fourier_basis(
    height: int,
    width: int,
    i: int,
    j: int,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The real unit-norm image whose 2-D spectrum is supported on bin ``(i, j)`` and ``(-i, -j)``.

    ``U = cos(2 pi (i y / height + j x / width)) / ||.||_2``: the inverse DFT of a unit coefficient at
    ``(i, j)`` plus its Hermitian mirror. For self-mirrored bins (DC, Nyquist rows/columns on even
    sizes) it is a single real cosine of values ``+-1 / sqrt(height * width)``.

    Args:
        height: image height (positive).
        width: image width (positive).
        i: row of the bin in the un-shifted :func:`torch.fft.fft2` layout, ``0 <= i < height``.
        j: column of the bin, ``0 <= j < width``.
        device: where to create the image.
        dtype: floating dtype of the image (default: torch's default dtype); computed in float64.

    Returns:
        A tensor of shape ``(height, width)`` with L2 norm 1.

    Raises:
        ValueError: if a size is not a positive integer or a bin index is out of range.

    Example:
        >>> u = fourier_basis(8, 8, 1, 2)
        >>> round(u.norm().item(), 6)
        1.0
        >>> spectrum = torch.fft.fft2(u).abs() > 1e-4
        >>> spectrum.nonzero().tolist()
        [[1, 2], [7, 6]]
    """
    _check_bin(height, width, i, j)
    y = torch.arange(height, device=device, dtype=torch.float64)[:, None]
    x = torch.arange(width, device=device, dtype=torch.float64)[None, :]
    # Reduce the phase modulo one period in exact integer arithmetic before the cosine.
    phase = ((i * y * width + j * x * height) % (height * width)) / (height * width)
    basis = torch.cos(2.0 * math.pi * phase)
    basis = basis / basis.norm()
    return basis.to(dtype or torch.get_default_dtype())


def _canonical_bins(height: int, width: int) -> list[tuple[int, int]]:
    """One bin of each Hermitian pair ``{(i, j), (-i, -j)}``, from the one-sided half ``j <= W // 2``."""
    bins = []
    for j in range(width // 2 + 1):
        for i in range(height):
            mirror = ((-i) % height, (-j) % width)
            if mirror[1] <= width // 2 and mirror < (i, j):
                continue  # its mirror is in the half too and comes first
            bins.append((i, j))
    return bins


def _check_inputs(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> None:
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if model.training:
        raise ValueError("model must be in eval mode (call model.eval() first), got a model in training mode")
    if not isinstance(images, torch.Tensor) or not images.is_floating_point() or images.dim() != 4:
        detail = (
            f"dtype {images.dtype} and shape {tuple(images.shape)}"
            if isinstance(images, torch.Tensor)
            else type(images).__name__
        )
        raise ValueError(f"images must be a floating tensor of shape (N, C, H, W), got {detail}")
    if len(images) == 0:
        raise ValueError("images must hold at least one image, got an empty batch")
    low, high = images.min().item(), images.max().item()
    if not (0.0 <= low and high <= 1.0):  # also rejects NaN
        raise ValueError(f"images must lie in [0, 1], got values in [{low}, {high}]")
    if (
        not isinstance(labels, torch.Tensor)
        or labels.dtype.is_floating_point
        or labels.is_complex()
        or labels.shape != (len(images),)
    ):
        detail = (
            f"dtype {labels.dtype} and shape {tuple(labels.shape)}"
            if isinstance(labels, torch.Tensor)
            else type(labels).__name__
        )
        raise ValueError(f"labels must be an integer tensor of shape ({len(images)},), got {detail}")


def fourier_heat_map(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    eps: float = 4.0,
    batch_size: int = 256,
    seed: int = 0,
    progress: bool = False,
) -> torch.Tensor:
    """Error rate of ``model`` under Fourier-basis noise of L2 norm ``eps``, for every frequency.

    For each bin, every image gets ``X + r * eps * U_ij`` with a random sign ``r`` per image and
    per channel (so each channel's perturbation has L2 norm ``eps``), clipped to ``[0, 1]``. Bins
    of several frequencies are packed into one forward pass of ``batch_size`` images. The signs
    come from a generator seeded with ``seed`` and are drawn bin by bin, so the map depends on
    ``seed`` but not on ``batch_size``. Runs under :func:`torch.no_grad` on ``images.device``
    (put the model there).

    Args:
        model: classifier in eval mode mapping ``(N, C, H, W)`` images in ``[0, 1]`` to
            ``(N, classes)`` logits (put normalisation inside the model).
        images: ``(N, C, H, W)`` test images in ``[0, 1]``.
        labels: ``(N,)`` integer class labels.
        eps: L2 norm of the perturbation per channel (``>= 0``); 4 in the paper for CIFAR-10.
        batch_size: images per forward pass (positive).
        seed: seed of the random signs (non-negative).
        progress: show a tqdm progress bar.

    Returns:
        A float64 tensor of shape ``(H, W)`` with error rates in ``[0, 1]``, centred: DC at
        ``(H // 2, W // 2)``, point-symmetric about it.

    Raises:
        TypeError: if ``eps`` is not a real number or ``batch_size`` or ``seed`` not an int.
        ValueError: if the model is in training mode, images are not ``(N, C, H, W)`` floating
            values in ``[0, 1]``, labels do not match, or ``eps``, ``batch_size`` or ``seed`` is
            out of range.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 2)).eval()
        >>> images = torch.rand(6, 3, 4, 4)
        >>> labels = model(images).argmax(1)
        >>> heat = fourier_heat_map(model, images, labels, eps=1.0, batch_size=16)
        >>> heat.shape, heat.dtype, bool(((heat >= 0) & (heat <= 1)).all())
        (torch.Size([4, 4]), torch.float64, True)
    """
    _check_inputs(model, images, labels)
    check_real("eps", eps, minimum=0)
    check_int("batch_size", batch_size, minimum=1)
    check_int("seed", seed, minimum=0)

    n, channels, height, width = images.shape
    device, dtype = images.device, images.dtype
    labels = labels.to(device)
    bins = _canonical_bins(height, width)
    generator = torch.Generator(device=device).manual_seed(seed)
    errors = torch.zeros(len(bins), dtype=torch.long, device=device)
    # Per bin: the scaled basis and the signs, drawn once, in bin order.
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    total = len(bins) * n
    with torch.no_grad():
        for start in tqdm(range(0, total, batch_size), desc="Fourier heat map", disable=not progress):
            stop = min(start + batch_size, total)
            first, last = start // n, (stop - 1) // n
            for k in [k for k in cache if k < first]:
                del cache[k]
            pieces, spans = [], []
            for k in range(first, last + 1):
                if k not in cache:
                    basis = eps * fourier_basis(height, width, *bins[k], device=device, dtype=dtype)
                    signs = torch.randint(0, 2, (n, channels, 1, 1), generator=generator, device=device)
                    cache[k] = (basis, signs.to(dtype) * 2 - 1)
                basis, signs = cache[k]
                lo, hi = max(start, k * n) - k * n, min(stop, (k + 1) * n) - k * n
                pieces.append((images[lo:hi] + signs[lo:hi] * basis).clamp(0.0, 1.0))
                spans.append((k, lo, hi))
            predictions = model(torch.cat(pieces)).argmax(dim=1)
            offset = 0
            for k, lo, hi in spans:
                size = hi - lo
                errors[k] += (predictions[offset : offset + size] != labels[lo:hi]).sum()
                offset += size

    heat = torch.zeros(height, width, dtype=torch.float64, device=device)
    rates = errors.to(torch.float64) / n
    for k, (i, j) in enumerate(bins):
        heat[i, j] = rates[k]
        heat[(-i) % height, (-j) % width] = rates[k]
    return torch.fft.fftshift(heat)


def save_heat_map(
    heat_map: torch.Tensor,
    png_path: str | PathLike[str],
    npy_path: str | PathLike[str] | None = None,
    title: str = "",
) -> None:
    """Plot a centred heat map (colour scale 0..1, axes in cycles/pixel) and optionally save the array.

    Uses :class:`matplotlib.figure.Figure` with the Agg canvas directly: no pyplot state and no
    global backend change. Parent directories are created.

    Args:
        heat_map: ``(H, W)`` centred map as returned by :func:`fourier_heat_map`.
        png_path: where to write the image (the format follows the suffix, e.g. ``.png``).
        npy_path: where to write the raw array with :func:`numpy.save`, or ``None``.
        title: figure title.

    Raises:
        ValueError: if ``heat_map`` is not a two-dimensional tensor.

    Example:
        >>> import tempfile, pathlib, numpy
        >>> heat = torch.rand(8, 8, dtype=torch.float64)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     save_heat_map(heat, pathlib.Path(tmp) / "maps" / "heat.png", pathlib.Path(tmp) / "heat.npy")
        ...     numpy.array_equal(numpy.load(pathlib.Path(tmp) / "heat.npy"), heat.numpy())
        True
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not isinstance(heat_map, torch.Tensor) or heat_map.dim() != 2:
        detail = (
            f"shape {tuple(heat_map.shape)}"
            if isinstance(heat_map, torch.Tensor)
            else type(heat_map).__name__
        )
        raise ValueError(f"heat_map must be a 2-D tensor (H, W), got {detail}")
    array = heat_map.detach().cpu().numpy()
    height, width = array.shape
    fy = np.fft.fftshift(np.fft.fftfreq(height))
    fx = np.fft.fftshift(np.fft.fftfreq(width))
    dy, dx = 1.0 / height, 1.0 / width
    extent = (fx[0] - dx / 2, fx[-1] + dx / 2, fy[0] - dy / 2, fy[-1] + dy / 2)

    figure = Figure(figsize=(4.8, 4.0))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    image = axes.imshow(
        array, vmin=0.0, vmax=1.0, cmap="jet", origin="lower", extent=extent, interpolation="nearest"
    )
    axes.set_xlabel("horizontal frequency $f_x$ (cycles/pixel)")
    axes.set_ylabel("vertical frequency $f_y$ (cycles/pixel)")
    if title:
        axes.set_title(title)
    colorbar = figure.colorbar(image, ax=axes)
    colorbar.set_label("error rate")
    figure.tight_layout()

    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path, dpi=120)
    if npy_path is not None:
        npy_path = Path(npy_path)
        npy_path.parent.mkdir(parents=True, exist_ok=True)
        np.save(npy_path, array)


def _extent(height: int, width: int) -> tuple[float, float, float, float]:
    fy = np.fft.fftshift(np.fft.fftfreq(height))
    fx = np.fft.fftshift(np.fft.fftfreq(width))
    dy, dx = 1.0 / height, 1.0 / width
    return (fx[0] - dx / 2, fx[-1] + dx / 2, fy[0] - dy / 2, fy[-1] + dy / 2)


def save_heat_map_difference(
    limited: torch.Tensor,
    full: torch.Tensor,
    png_path: str | PathLike[str],
    *,
    names: tuple[str, str] = ("band-limited", "full-spectrum"),
    box: tuple[float, float] | None = None,
    title: str = "",
) -> Path:
    """Two centred heat maps and their difference (first minus second), with the kept box drawn.

    Three panels: ``limited``, ``full`` (error rate, 0..1) and ``limited - full`` (a diverging
    scale, -1..1: red where the band-limited model errs more). ``box = (f_h, f_w)`` in
    cycles/pixel (:attr:`~lightning_bandlimit.recipes.threats.input_band.InputBand.box`) is drawn on
    every panel as the rectangle ``|f_y| <= f_h, |f_x| <= f_w``: the frequencies the band-limited
    model's input layer keeps.

    Args:
        limited: ``(H, W)`` centred map of the band-limited model (e.g. a mean over seeds).
        full: ``(H, W)`` centred map of the full-spectrum model.
        png_path: where to write the figure (parents are created).
        names: the two models' names, for the panel titles.
        box: the kept box, or ``None`` to draw none.
        title: the figure title.

    Returns:
        The path written.

    Raises:
        ValueError: if the maps are not two 2-D tensors of one shape.

    Example:
        >>> import tempfile, pathlib
        >>> a, b = torch.rand(8, 8), torch.rand(8, 8)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     path = save_heat_map_difference(a, b, pathlib.Path(tmp) / "d.png", box=(0.25, 0.25))
        ...     path.stat().st_size > 0
        True
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    if (
        not isinstance(limited, torch.Tensor)
        or not isinstance(full, torch.Tensor)
        or limited.dim() != 2
        or limited.shape != full.shape
    ):
        shapes = [
            tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (limited, full)
        ]
        raise ValueError(f"expected two 2-D heat maps (H, W) of one shape, got {shapes[0]} and {shapes[1]}")
    maps = [limited.detach().cpu().double().numpy(), full.detach().cpu().double().numpy()]
    maps.append(maps[0] - maps[1])
    extent = _extent(*maps[0].shape)
    figure = Figure(figsize=(13.0, 4.2))
    FigureCanvasAgg(figure)
    panels = [
        (maps[0], f"{names[0]}: error rate", "jet", 0.0, 1.0),
        (maps[1], f"{names[1]}: error rate", "jet", 0.0, 1.0),
        (maps[2], f"{names[0]} minus {names[1]}", "RdBu_r", -1.0, 1.0),
    ]
    for index, (array, label, cmap, low, high) in enumerate(panels):
        axes = figure.add_subplot(1, 3, index + 1)
        image = axes.imshow(
            array, vmin=low, vmax=high, cmap=cmap, origin="lower", extent=extent, interpolation="nearest"
        )
        if box is not None:
            axes.add_patch(
                Rectangle(
                    (-box[1], -box[0]),
                    2 * box[1],
                    2 * box[0],
                    fill=False,
                    edgecolor="black",
                    linewidth=1.5,
                    linestyle="--",
                    label="kept box",
                )
            )
            if index == 2:
                axes.legend(loc="upper right", fontsize=7)
        axes.set_title(label, fontsize=9)
        axes.set_xlabel("$f_x$ (cycles/pixel)", fontsize=8)
        axes.set_ylabel("$f_y$ (cycles/pixel)", fontsize=8)
        figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    if title:
        figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(png_path, dpi=110)
    return png_path
