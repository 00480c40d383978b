"""The images a model's input layer keeps, and the ones it drops: exact threat subspaces.

A band-limited convolution sees its input only through the band coefficients of the padded
input (:mod:`lightning_bandlimit.functional.band_projection`): per axis a real matrix
``M = synthesis @ analysis`` maps the unpadded input onto the grid positions the convolution
reads, with the padding (any mode) and the stride folded in. The layer's output therefore
depends on an image ``X`` (per channel) only through ``M_h X M_w^T``, and the images it keeps
form the separable subspace ``row(M_h) (x) row(M_w)``, whose orthogonal projector is
``Q_h (x) Q_w`` (``Q`` the projector onto the row space of ``M``, from its SVD). The images it
drops, the null space, are the exact complement ``I - Q_h (x) Q_w``. Both are derived from the
loaded model: its first convolution that the image reaches, at its compression, on the image's
own grid. Anything before that layer must act per pixel and channel-wise linearly (an affine
normalisation does), which :func:`input_band` checks numerically on the model itself.

Example:
    >>> from torch import nn
    >>> from lightning_bandlimit.layers.surgery import bandlimit
    >>> model = bandlimit(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten()), 0.5).eval()
    >>> band = input_band(model, (3, 16, 16))
    >>> band.layer, band.kept.dims, band.dropped.dims
    ('0', 169, 87)
    >>> delta = band.dropped.project(torch.randn(2, 3, 16, 16, dtype=torch.float64)).float()
    >>> x = torch.rand(2, 3, 16, 16)
    >>> torch.allclose(model(x + delta), model(x), atol=1e-5)
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from lightning_bandlimit.functional.band_projection import projection_plan
from lightning_bandlimit.functional.geometry import resolve_geometry
from lightning_bandlimit.layers.band_limited import BandLimitedConv2d
from lightning_bandlimit.utils.validation import check_int

__all__ = ["MODEL_BANDS", "BandSubspace", "InputBand", "input_band"]

#: Band names defined by a model's input layer (see :class:`InputBand`).
MODEL_BANDS = ("dropped", "kept")

_RANK_TOLERANCE = 1e-9  # singular values below this fraction of the largest count as zero
_CHECK_TOLERANCE = 1e-4  # relative change of the input layer's output a dropped perturbation may cause


def _row_space_projector(matrix: torch.Tensor) -> torch.Tensor:
    """``(n, n)`` float64 orthogonal projector onto the row space of ``matrix`` (``(m, n)``)."""
    _, singular, vh = torch.linalg.svd(matrix.to(torch.float64), full_matrices=False)
    rank = int((singular > _RANK_TOLERANCE * singular.max()).sum()) if singular.numel() else 0
    basis = vh[:rank]
    return basis.T @ basis


@dataclass(frozen=True, eq=False)
class BandSubspace:
    """One part (``"kept"`` or ``"dropped"``) of an :class:`InputBand`: an exact projection of images.

    Attributes:
        band: the input band it belongs to.
        part: ``"kept"`` or ``"dropped"``.
    """

    band: InputBand
    part: Literal["kept", "dropped"]

    @property
    def dims(self) -> int:
        """Dimension of the subspace per channel (of ``H * W``)."""
        kept = self.band.kept_dims
        return kept if self.part == "kept" else self.band.size[0] * self.band.size[1] - kept

    @property
    def is_full(self) -> bool:
        """Whether the subspace is every image (its projection is the identity)."""
        return self.dims == self.band.size[0] * self.band.size[1]

    @property
    def is_empty(self) -> bool:
        """Whether the subspace holds only the zero image."""
        return self.dims == 0

    @property
    def fraction(self) -> float:
        """``dims / (H * W)``."""
        return self.dims / (self.band.size[0] * self.band.size[1])

    def describe(self) -> str:
        """In words: the part, its source and its share of the image's dimensions."""
        return f"{self.part} by {self.band.describe()}: {100 * self.fraction:.0f} % of the image's dimensions"

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Project ``(..., H, W)`` images onto the subspace (exact, real, differentiable).

        Raises:
            ValueError: if the last two dimensions are not the band's image size.
        """
        if (
            not isinstance(x, torch.Tensor)
            or not x.is_floating_point()
            or tuple(x.shape[-2:]) != self.band.size
        ):
            got = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(
                f"expected real images of size (..., {self.band.size[0]}, {self.band.size[1]}), got {got}"
            )
        if self.is_full:
            return x.clone()
        if self.is_empty:
            return torch.zeros_like(x)
        rows = self.band.rows.to(device=x.device, dtype=x.dtype)
        cols = self.band.cols.to(device=x.device, dtype=x.dtype)
        kept = torch.matmul(torch.matmul(rows, x), cols)  # both projectors are symmetric
        return kept if self.part == "kept" else x - kept


@dataclass(frozen=True, eq=False)
class InputBand:
    """What a model's input layer keeps of an image: the separable projector ``rows (x) cols``.

    Attributes:
        size: the image size ``(H, W)``.
        rows: ``(H, H)`` float64 orthogonal projector along H.
        cols: ``(W, W)`` float64 orthogonal projector along W.
        model: the model's name.
        layer: the qualified name of the input layer (the first convolution the image reaches).
        compression: the compression that layer applies on the image's grid (0: it keeps all).
        box: the highest kept frequency per axis ``(f_h, f_w)`` in cycles/pixel (0.5 when the
            axis keeps every frequency): the edge of the kept box on the padded grid.
    """

    size: tuple[int, int]
    rows: torch.Tensor
    cols: torch.Tensor
    model: str
    layer: str
    compression: float
    box: tuple[float, float]
    kept: BandSubspace = field(init=False)
    dropped: BandSubspace = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kept", BandSubspace(self, "kept"))
        object.__setattr__(self, "dropped", BandSubspace(self, "dropped"))

    @property
    def kept_dims(self) -> int:
        """Dimension of the kept subspace per channel."""
        return round(float(self.rows.trace())) * round(float(self.cols.trace()))

    def part(self, name: str) -> BandSubspace:
        """``"kept"`` or ``"dropped"``.

        Raises:
            ValueError: for another name.
        """
        if name not in MODEL_BANDS:
            raise ValueError(f"expected a model band in {list(MODEL_BANDS)}, got {name!r}")
        return self.kept if name == "kept" else self.dropped

    def same_as(self, other: InputBand) -> bool:
        """Whether two bands are the same subspace (e.g. two training seeds of one architecture)."""
        return (
            self.size == other.size
            and torch.allclose(self.rows, other.rows, atol=1e-9)
            and torch.allclose(self.cols, other.cols, atol=1e-9)
        )

    def describe(self) -> str:
        """The source in words."""
        return f"model {self.model!r} (input layer {self.layer!r}, compression {self.compression:.3g})"


def _first_convolution(model: nn.Module, images: torch.Tensor) -> tuple[str, nn.Conv2d, torch.Tensor]:
    """The first ``nn.Conv2d`` (band-limited or not) the images reach, and its input."""
    names = {module: name for name, module in model.named_modules()}
    seen: list[tuple[str, nn.Conv2d, torch.Tensor]] = []

    def hook(module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        if not seen and args and isinstance(args[0], torch.Tensor):
            seen.append((names[module] or "<root>", module, args[0].detach()))  # type: ignore[arg-type]

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, nn.Conv2d)]
    try:
        with torch.no_grad():
            model(images)
    finally:
        for handle in handles:
            handle.remove()
    if not seen:
        raise ValueError(
            f"expected a model whose input reaches an nn.Conv2d (the layer that defines its band), got "
            f"{type(model).__name__} with none reached by a {tuple(images.shape[1:])} image"
        )
    return seen[0]


def _box_edge(grid: int, kept_half: int) -> float:
    return 0.5 if 2 * kept_half + 1 >= grid else kept_half / grid


def input_band(
    model: nn.Module,
    image_shape: tuple[int, int, int],
    *,
    name: str = "model",
    probe: torch.Tensor | None = None,
) -> InputBand:
    """Derive the band a model's input layer keeps, on the image's own grid.

    The input layer is the first ``nn.Conv2d`` the image reaches (found with forward pre-hooks
    on one forward pass). When it is band-limited with a compression above 0, the band is its
    kept box with its padding and stride accounted for (module docstring); otherwise the model
    keeps every frequency (``dropped`` is empty). The result is checked on the model: a random
    perturbation in the dropped part must change the input layer's output by less than
    ``1e-4`` of its size, which fails when something before that layer mixes pixels.

    Args:
        model: the classifier, in eval mode, mapping ``(N, C, H, W)`` images to logits.
        image_shape: ``(C, H, W)`` of the images it is evaluated on.
        name: the model's name (for messages and :meth:`InputBand.describe`).
        probe: an optional ``(N, C, H, W)`` batch of real images for the check (default: grey
            images); put it on the model's device.

    Returns:
        The :class:`InputBand`; ``.kept`` and ``.dropped`` project images onto its two parts.

    Raises:
        TypeError: if ``image_shape`` is not a sequence of ints.
        ValueError: if ``image_shape`` has not three positive sizes, when no ``nn.Conv2d`` is
            reached, the input layer sees another size than the image's, or the check fails (the
            message names the layer and the change).

    Example:
        >>> from torch import nn
        >>> plain = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten()).eval()
        >>> band = input_band(plain, (1, 8, 8), name="plain")
        >>> band.compression, band.dropped.is_empty
        (0.0, True)
    """
    if not isinstance(image_shape, (tuple, list, torch.Size)):
        raise TypeError(f"expected image_shape (C, H, W) of positive integers, got {image_shape!r}")
    if len(image_shape) != 3:
        raise ValueError(f"expected image_shape (C, H, W) of positive integers, got {image_shape!r}")
    channels, height, width = (
        check_int(f"image_shape[{i}]", v, minimum=1) for i, v in enumerate(image_shape)
    )
    parameter = next(iter(model.parameters()), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    dtype = parameter.dtype if parameter is not None and parameter.is_floating_point() else torch.float32
    if probe is None:
        probe = torch.full((1, channels, height, width), 0.5, device=device, dtype=dtype)
    layer_name, layer, layer_input = _first_convolution(model, probe)
    if tuple(layer_input.shape[-2:]) != (height, width):
        raise ValueError(
            f"model {name!r}: expected its input layer {layer_name!r} to see the image's grid "
            f"{(height, width)}, "
            f"got {tuple(layer_input.shape[-2:])}: the model resizes the image before it, so the layer's "
            "band "
            "is not a band of the image"
        )
    identity_h = torch.eye(height, dtype=torch.float64)
    identity_w = torch.eye(width, dtype=torch.float64)
    if not isinstance(layer, BandLimitedConv2d) or layer.compression == 0.0:
        return InputBand((height, width), identity_h, identity_w, name, layer_name, 0.0, (0.5, 0.5))
    geometry = resolve_geometry(
        layer_input,
        layer.weight,
        layer.bias,
        layer.stride,
        layer.padding,
        layer.dilation,
        layer.groups,
        layer.padding_mode,
        2,
    )
    plan = projection_plan(geometry, layer.compression, torch.float64, torch.device("cpu"))
    rows = _row_space_projector(plan.synthesis_h @ plan.analysis_h)
    cols = _row_space_projector(plan.synthesis_w @ plan.analysis_w)
    box = (_box_edge(geometry.grid[0], plan.band.half_rows), _box_edge(geometry.grid[1], plan.band.cols - 1))
    band = InputBand((height, width), rows, cols, name, layer_name, plan.band.compression, box)
    _check(model, layer, probe, band, name, layer_name)
    return band


def _check(
    model: nn.Module, layer: nn.Module, probe: torch.Tensor, band: InputBand, name: str, layer_name: str
) -> None:
    """A dropped perturbation must leave the input layer's output unchanged (on the whole model)."""
    if band.dropped.is_empty:
        return
    outputs: list[torch.Tensor] = []
    handle = layer.register_forward_hook(lambda _m, _a, out: outputs.append(out.detach()))
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn(probe.shape, generator=generator, dtype=torch.float64)
    delta = band.dropped.project(noise)
    delta = (0.25 * delta / delta.abs().amax().clamp_min(1e-12)).to(device=probe.device, dtype=probe.dtype)
    try:
        with torch.no_grad():
            model(probe)
            model(probe + delta)
    finally:
        handle.remove()
    if len(outputs) < 2:
        return
    moved = float((outputs[1] - outputs[0]).norm())
    scale = float(outputs[0].norm())
    change = moved / max(scale, 1e-12)
    if not math.isfinite(change) or moved > _CHECK_TOLERANCE * max(scale, 1.0):
        raise ValueError(
            f"model {name!r}: a perturbation in the band its input layer {layer_name!r} drops changed that "
            f"layer's output by {change:.3g} of its size (expected < {_CHECK_TOLERANCE:g}): something before "
            "the layer mixes pixels, so its band is not a band of the image"
        )
