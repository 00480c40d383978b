"""Radial frequency bands of images: masks and exact projections for band-restricted threat models.

A band is a half-open interval ``[low, high)`` of *normalised radial frequency*
``r = sqrt(f_y**2 + f_x**2) / sqrt(0.5)`` of the 2-D DFT bins (``f`` in cycles/pixel, as
:func:`torch.fft.fftfreq` gives them), so ``r = 0`` is DC and ``r = 1`` is the corner
``|f_y| = |f_x| = 0.5``; a band ending at ``high = 1`` also includes ``r = 1``. Masks use the
un-shifted :func:`torch.fft.fft2` layout.

Because ``r(-f) = r(f)`` the masks are Hermitian-symmetric, so :func:`band_project` maps a real
image to a real image, and it is an orthogonal projection (linear, idempotent, self-adjoint).
The named bands in :data:`BANDS` partition the spectrum: ``low | mid | high == full``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch

from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["BANDS", "band_mask", "band_project", "radial_frequency", "resolve_band"]

#: Named radial bands, as ``(low, high)`` in normalised radial frequency.
BANDS: Mapping[str, tuple[float, float]] = MappingProxyType(
    {"low": (0.0, 0.25), "mid": (0.25, 0.5), "high": (0.5, 1.0), "full": (0.0, 1.0)}
)


def _check_size(height: int, width: int) -> None:
    check_int("height", height, minimum=1)
    check_int("width", width, minimum=1)


def resolve_band(band: str | tuple[float, float]) -> tuple[float, float]:
    """Validate a band given by name (a key of :data:`BANDS`) or as a ``(low, high)`` pair.

    Args:
        band: ``"low"``, ``"mid"``, ``"high"``, ``"full"``, or a pair of real numbers with
            ``0 <= low < high <= 1`` (normalised radial frequency).

    Returns:
        The band as a pair of floats.

    Raises:
        TypeError: if ``band`` is neither a name nor a pair, or an end is not a real number.
        ValueError: if the name is unknown (the message lists the names), the pair has not two
            ends, or they are not finite with ``0 <= low < high <= 1``.

    Example:
        >>> resolve_band("high")
        (0.5, 1.0)
        >>> resolve_band((0, 0.3))
        (0.0, 0.3)
    """
    if isinstance(band, str):
        if band not in BANDS:
            raise ValueError(
                f"unknown band name {band!r}; expected one of {sorted(BANDS)} or a (low, high) pair"
            )
        return BANDS[band]
    expected = f"band must be a name in {sorted(BANDS)} or a pair (low, high) of real numbers, got {band!r}"
    if not isinstance(band, (tuple, list)):
        raise TypeError(expected)
    if len(band) != 2:
        raise ValueError(expected)
    low, high = check_real("band low", band[0]), check_real("band high", band[1])
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"band must satisfy 0 <= low < high <= 1, got (low, high) = ({low}, {high})")
    return low, high


def radial_frequency(height: int, width: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Normalised radial frequency of every bin of an un-shifted ``height x width`` 2-D DFT.

    ``r = sqrt(f_y**2 + f_x**2) / sqrt(0.5)`` with ``f_y, f_x`` from :func:`torch.fft.fftfreq`
    (cycles/pixel); 0 at DC, 1 at the corner ``|f_y| = |f_x| = 0.5`` (reached only on even sizes).
    Computed in float64 as ``sqrt(2 * (f_y**2 + f_x**2))``, so mirrored bins get bit-identical values
    and dyadic band edges such as ``0.5`` are hit exactly.

    Args:
        height: number of rows (positive).
        width: number of columns (positive).
        device: where to create the tensor.

    Returns:
        A float64 tensor of shape ``(height, width)``.

    Raises:
        ValueError: if ``height`` or ``width`` is not a positive integer.

    Example:
        >>> r = radial_frequency(4, 4)
        >>> r[0, 0].item(), r[2, 2].item(), round(r[0, 2].item(), 6)
        (0.0, 1.0, 0.707107)
    """
    _check_size(height, width)
    fy = torch.fft.fftfreq(height, device=device, dtype=torch.float64)
    fx = torch.fft.fftfreq(width, device=device, dtype=torch.float64)
    return torch.sqrt(2.0 * (fy[:, None] ** 2 + fx[None, :] ** 2))


def band_mask(
    height: int,
    width: int,
    band: str | tuple[float, float],
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Boolean mask of the bins with ``low <= r < high`` (``r <= 1`` when ``high == 1``).

    Args:
        height: number of rows (positive).
        width: number of columns (positive).
        band: ``(low, high)`` with ``0 <= low < high <= 1``, or a name in :data:`BANDS`.
        device: where to create the mask.

    Returns:
        A bool tensor of shape ``(height, width)`` in the un-shifted :func:`torch.fft.fft2` layout;
        Hermitian-symmetric (``mask[i, j] == mask[-i, -j]``). It can be empty on tiny grids.

    Raises:
        ValueError: if the band or the size is invalid.

    Example:
        >>> band_mask(4, 4, "low").sum().item(), band_mask(4, 4, "full").all().item()
        (1, True)
    """
    low, high = resolve_band(band)
    r = radial_frequency(height, width, device=device)
    upper = torch.ones_like(r, dtype=torch.bool) if high >= 1.0 else r < high
    return (r >= low) & upper


def band_project(x: torch.Tensor, band: str | tuple[float, float]) -> torch.Tensor:
    """Keep only the band of the last two dimensions of a real tensor (``fft2 -> mask -> ifft2``).

    An orthogonal projection: linear, idempotent, self-adjoint, and real-to-real. Differentiable.
    The full band ``(0, 1)`` returns a copy of ``x`` without a round trip through the FFT.

    Args:
        x: real floating tensor of shape ``(..., H, W)``.
        band: ``(low, high)`` with ``0 <= low < high <= 1``, or a name in :data:`BANDS`.

    Returns:
        A tensor of the shape and dtype of ``x``.

    Raises:
        ValueError: if ``x`` is not a real floating tensor with at least two dimensions, or the
            band is invalid.

    Example:
        >>> x = torch.rand(2, 3, 8, 8, dtype=torch.float64)
        >>> low, high = band_project(x, "low"), band_project(x, (0.25, 1.0))
        >>> torch.allclose(low + high, x), torch.allclose(band_project(low, "low"), low)
        (True, True)
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() < 2:
        detail = (
            f"dtype {x.dtype} and shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        )
        raise ValueError(f"x must be a real floating tensor with at least 2 dimensions, got {detail}")
    band = resolve_band(band)
    if band == BANDS["full"]:
        return x.clone()
    mask = band_mask(x.shape[-2], x.shape[-1], band, device=x.device)
    spectrum = torch.fft.fft2(x) * mask.to(x.dtype)
    return torch.fft.ifft2(spectrum).real.contiguous()
