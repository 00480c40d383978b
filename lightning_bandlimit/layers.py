"""``nn.Conv1d`` / ``nn.Conv2d`` twins that convolve in the frequency domain, band-limited.

Each layer subclasses the plain convolution, so parameters, ``state_dict`` keys, ``repr`` and
every attribute are those of ``nn.Conv2d``; only the forward pass differs, and one attribute,
``compression``, is added (it is not part of the ``state_dict``: a checkpoint of either model
loads into the other).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from lightning_bandlimit.functional import check_compression, fft_conv1d, fft_conv2d, fft_grid, spectral_band

__all__ = ["BandLimitedConv1d", "BandLimitedConv2d", "BandLimitedConvNd"]

_Self = TypeVar("_Self", bound="BandLimitedConvNd")
_BANDLIMIT_ATTRIBUTES = ("_compression", "achieved_compression", "memory_lean", "algorithm")


def _twin(source: nn.Module, cls: type, skip: tuple[str, ...] = ()) -> Any:
    """A new ``cls`` object with ``source``'s state: containers copied, their contents shared."""
    twin = cls.__new__(cls)
    twin.__dict__.update(
        {
            k: copy.copy(v) if isinstance(v, (dict, set)) else v
            for k, v in source.__dict__.items()
            if k not in skip
        }
    )
    return twin


class BandLimitedConvNd:
    """Behaviour shared by :class:`BandLimitedConv1d` and :class:`BandLimitedConv2d`.

    Attributes:
        compression: requested fraction of spectral coefficients to discard, in ``[0, 1)``;
            may be changed at any time, it applies from the next forward pass.
        achieved_compression: the quantised rate actually applied in the last forward pass
            (``None`` before the first one); it depends on the input size.
        memory_lean: in training mode, keep for backward only the smallest exact form of the
            input and offer the output as its spectrum to a following lean BatchNorm (see
            ``memory_lean`` in :func:`~lightning_bandlimit.functional.fft_conv2d`); on by
            default, may be changed at any time.
        algorithm: ``"auto"`` (default), ``"spectral"`` or ``"spatial"``: how the band-limited
            convolution is computed (``algorithm`` in
            :func:`~lightning_bandlimit.functional.fft_conv2d`; same result either way). Set it
            to ``"spectral"`` to measure the frequency-domain kernel itself.
    """

    _plain: type[nn.Module]  # the convolution class this one band-limits
    _functional: Callable[..., torch.Tensor]  # fft_conv1d or fft_conv2d
    _compression: float
    achieved_compression: float | None
    memory_lean: bool
    algorithm: str = "auto"

    def __init__(self, *args: Any, compression: float = 0.0, memory_lean: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_bandlimit(compression, memory_lean)

    def _conv_forward(
        self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        out = type(self)._functional(
            input,
            weight,
            bias,
            self.stride,  # type: ignore[attr-defined]
            self.padding,  # type: ignore[attr-defined]
            self.dilation,  # type: ignore[attr-defined]
            self.groups,  # type: ignore[attr-defined]
            padding_mode=self.padding_mode,  # type: ignore[attr-defined]
            compression=self._compression,
            memory_lean=self.memory_lean and self.training,  # type: ignore[attr-defined]
            algorithm=self.algorithm,
        )
        self._record_band(input)
        return out

    def _init_bandlimit(self, compression: float, memory_lean: bool = True) -> None:
        if not isinstance(memory_lean, bool):
            raise TypeError(f"memory_lean must be a bool, got {memory_lean!r}")
        self.compression = compression
        self.achieved_compression = None
        self.memory_lean = memory_lean

    @property
    def compression(self) -> float:
        return self._compression

    @compression.setter
    def compression(self, value: float) -> None:
        self._compression = check_compression(value)

    @classmethod
    def from_conv(
        cls: type[_Self], conv: nn.Module, compression: float = 0.0, memory_lean: bool = True
    ) -> _Self:
        """A band-limited twin of ``conv`` that shares its ``Parameter`` objects.

        Everything else (buffers, hooks, train/eval mode, user attributes) is copied, so the
        twin behaves like ``conv`` except for the forward computation.

        Args:
            conv: an ``nn.Conv2d`` (for :class:`BandLimitedConv2d`) or ``nn.Conv1d``, or a
                band-limited layer of the same dimensionality.
            compression: the twin's compression, in ``[0, 1)``.
            memory_lean: the twin's ``memory_lean`` (see the class attributes).

        Raises:
            TypeError: if ``conv`` is not a plain convolution of the matching dimensionality.
            ValueError: if ``compression`` is outside ``[0, 1)``.

        Example:
            >>> conv = nn.Conv2d(3, 8, 3, padding=1)
            >>> twin = BandLimitedConv2d.from_conv(conv, compression=0.5)
            >>> twin.weight is conv.weight, twin.compression
            (True, 0.5)
        """
        if type(conv) not in (cls._plain, cls):
            raise TypeError(
                f"{cls.__name__}.from_conv expects an {cls._plain.__module__}.{cls._plain.__name__} "
                f"(not a subclass) or a {cls.__name__}, got {type(conv).__name__}"
            )
        compression = check_compression(compression)
        twin = _twin(conv, cls)
        twin._init_bandlimit(compression, memory_lean)
        return twin

    def to_conv(self) -> nn.Module:
        """The plain convolution this layer band-limits, sharing its ``Parameter`` objects.

        The exact inverse of :meth:`from_conv`.

        Example:
            >>> layer = BandLimitedConv2d(3, 8, 3, compression=0.25)
            >>> plain = layer.to_conv()
            >>> type(plain).__name__, plain.weight is layer.weight
            ('Conv2d', True)
        """
        return _twin(self, self._plain, skip=_BANDLIMIT_ATTRIBUTES)  # type: ignore[arg-type]

    def _record_band(self, input: torch.Tensor) -> None:
        spatial = tuple(input.shape[-len(self.kernel_size) :])  # type: ignore[attr-defined]
        grid = fft_grid(spatial, self.kernel_size, self.padding, self.dilation)  # type: ignore[attr-defined]
        self.achieved_compression = spectral_band(grid, self._compression).compression

    def extra_repr(self) -> str:
        lean = "" if self.memory_lean else ", memory_lean=False"
        algorithm = "" if self.algorithm == "auto" else f", algorithm={self.algorithm!r}"
        return f"{super().extra_repr()}, compression={self._compression}{lean}{algorithm}"  # type: ignore[misc]


class BandLimitedConv2d(BandLimitedConvNd, nn.Conv2d):
    """``nn.Conv2d`` computed in the frequency domain, with the high frequencies dropped.

    Same constructor as ``nn.Conv2d`` plus ``compression``; see
    :func:`~lightning_bandlimit.functional.fft_conv2d` for what the compression means. At
    ``compression=0`` the output equals ``nn.Conv2d``'s up to round-off.

    Args:
        in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
            padding_mode, device, dtype: as ``nn.Conv2d``.
        compression: fraction of spectral coefficients to discard, in ``[0, 1)``.
        memory_lean: keep the smallest exact form for backward (see the attributes of
            :class:`BandLimitedConvNd`).

    Raises:
        ValueError: if ``compression`` is outside ``[0, 1)``, or as ``nn.Conv2d``.

    Example:
        >>> layer = BandLimitedConv2d(3, 8, kernel_size=3, padding=1, compression=0.5)
        >>> layer(torch.randn(2, 3, 16, 16)).shape
        torch.Size([2, 8, 16, 16])
        >>> round(layer.achieved_compression, 2)  # quantised on the 18 x 18 padded grid
        0.49
        >>> layer.compression = 0.0  # may change at run time
    """

    _plain = nn.Conv2d
    _functional = staticmethod(fft_conv2d)


class BandLimitedConv1d(BandLimitedConvNd, nn.Conv1d):
    """``nn.Conv1d`` computed in the frequency domain, with the high frequencies dropped.

    Same constructor as ``nn.Conv1d`` plus ``compression``; see
    :func:`~lightning_bandlimit.functional.fft_conv1d`.

    Args:
        in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
            padding_mode, device, dtype: as ``nn.Conv1d``.
        compression: fraction of spectral coefficients to discard, in ``[0, 1)``.
        memory_lean: as :class:`BandLimitedConv2d`.

    Raises:
        ValueError: if ``compression`` is outside ``[0, 1)``, or as ``nn.Conv1d``.

    Example:
        >>> layer = BandLimitedConv1d(2, 4, kernel_size=5, padding="same", compression=0.75)
        >>> layer(torch.randn(1, 2, 100)).shape
        torch.Size([1, 4, 100])
    """

    _plain = nn.Conv1d
    _functional = staticmethod(fft_conv1d)
