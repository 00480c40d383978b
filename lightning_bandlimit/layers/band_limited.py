"""``nn.Conv1d`` / ``nn.Conv2d`` twins that convolve in the frequency domain, band-limited.

Each layer subclasses the plain convolution, so parameters, ``state_dict`` keys, ``repr`` and
every attribute are those of ``nn.Conv2d``; only the forward pass differs, and one attribute,
``compression``, is added (it is not part of the ``state_dict``: a checkpoint of either model
loads into the other).
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

import torch
from torch import nn

from lightning_bandlimit.functional.algorithm import check_algorithm
from lightning_bandlimit.functional.compile import compiled_band_limited_conv
from lightning_bandlimit.functional.fft_conv import band_limited_conv
from lightning_bandlimit.functional.lean.handoff import disengage, engage, published_any
from lightning_bandlimit.utils.validation import check_bool, check_compression

__all__ = [
    "BANDLIMITED_TWINS",
    "BandLimitedConv1d",
    "BandLimitedConv2d",
    "BandLimitedConvNd",
    "swap_to_bandlimited",
    "swap_to_plain",
]

_Self = TypeVar("_Self", bound="BandLimitedConvNd")
_BANDLIMIT_ATTRIBUTES = ("_compression", "_achieved_compression", "memory_lean", "_algorithm", "_full_band")


def _twin(source: nn.Module, cls: type) -> Any:
    """A new ``cls`` object with ``source``'s state: containers copied, their contents shared."""
    twin = cls.__new__(cls)
    twin.__dict__.update(
        {k: copy.copy(v) if isinstance(v, (dict, set)) else v for k, v in source.__dict__.items()}
    )
    return twin


def native_geometry(conv: nn.Module) -> bool:
    """Whether ``conv``'s padding lets ``algorithm="auto"`` run the native convolution at a full
    band: zeros, the same before and after on every axis (``padding="same"`` pads asymmetrically
    where a total ``dilation * (kernel_size - 1)`` is odd).

    Example:
        >>> odd, even = nn.Conv2d(1, 1, 3, padding="same"), nn.Conv2d(1, 1, 2, padding="same")
        >>> native_geometry(odd), native_geometry(even)
        (True, False)
    """
    if conv.padding_mode != "zeros":
        return False
    if conv.padding == "same":
        return all(d * (k - 1) % 2 == 0 for d, k in zip(conv.dilation, conv.kernel_size))  # type: ignore[arg-type]
    return True


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
            to ``"spectral"`` to measure the frequency-domain kernel itself; an unknown name is
            refused when set.

    ``compression`` and ``algorithm`` are checked when set (the constructor sets them too); the
    forward pass trusts them.

    **The full band at plain speed**: where ``algorithm="auto"`` would run the native
    convolution whatever the input (``compression=0``, ``padding_mode="zeros"``, symmetric
    padding: not ``padding="same"`` with an even total), the setters record it once and the
    forward pass is ``nn.Conv2d``'s own, with no per-call planning: the same op, so the same
    result bit for bit. The one exception is checked per call, cheaply: in memory-lean training,
    an input an earlier lean op published a recipe for still goes through the lean native
    convolution (any recipe at all sends the call down the general path). ``padding``,
    ``padding_mode``, ``dilation`` and ``kernel_size`` are read at construction and by the
    setters, as ``nn.Conv2d`` reads its padding once.

    Under ``torch.compile`` the layer compiles without graph breaks: at ``compression=0`` it
    runs ``nn.Conv2d``'s forward, above it one custom op
    (:mod:`~lightning_bandlimit.functional.compile`) whose compiled graph serves every
    compression; memory-lean training is not traceable and the compiled layer keeps what
    ``nn.Conv2d`` keeps (one warning).
    """

    _plain: type[nn.Module]  # the convolution class this one band-limits
    _compression: float
    _algorithm: str = "auto"
    # A 0-d tensor when set inside a compiled graph (a tensor serves every compression).
    _achieved_compression: float | torch.Tensor | None = None
    # Set by the setters: every forward pass is the native convolution (class docstring).
    _full_band: bool = False
    memory_lean: bool

    def __init__(self, *args: Any, compression: float = 0.0, memory_lean: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.compression = compression
        self.memory_lean = check_bool("memory_lean", memory_lean)
        self.achieved_compression = None

    def _conv_forward(
        self, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        compiling = torch.compiler.is_compiling()
        if (
            self._full_band
            and not compiling
            and (not (self.memory_lean and self.training) or not published_any())  # type: ignore[attr-defined]
        ):  # the native convolution, and no input can carry a recipe for the lean hand-off
            self.__dict__["_achieved_compression"] = 0.0  # a plain attribute: skip Module.__setattr__
            return super()._conv_forward(input, weight, bias)  # type: ignore[misc]
        if compiling and self._compression == 0:  # the full band: the plain convolution compiles natively
            self._achieved_compression = 0.0
            return super()._conv_forward(input, weight, bias)  # type: ignore[misc]
        if not self._full_band and not compiling:
            engage(self)  # its outputs may be band-limited: the lean modules look at their inputs
        out, achieved = (compiled_band_limited_conv if compiling else band_limited_conv)(
            input,
            weight,
            bias,
            self.stride,  # type: ignore[attr-defined]
            self.padding,  # type: ignore[attr-defined]
            self.dilation,  # type: ignore[attr-defined]
            self.groups,  # type: ignore[attr-defined]
            self.padding_mode,  # type: ignore[attr-defined]
            self._compression,
            len(self.kernel_size),  # type: ignore[attr-defined]
            self.memory_lean and self.training,  # type: ignore[attr-defined]
            self._algorithm,
        )
        # compiled: a 0-d tensor (a graph serves every compression); eager: the band kept
        self._achieved_compression = achieved if compiling else achieved.compression  # type: ignore[union-attr]
        return out

    @property
    def achieved_compression(self) -> float | None:
        value = self._achieved_compression
        return float(value) if isinstance(value, torch.Tensor) else value

    @achieved_compression.setter
    def achieved_compression(self, value: float | None) -> None:
        self._achieved_compression = value

    @property
    def compression(self) -> float:
        return self._compression

    @compression.setter
    def compression(self, value: float) -> None:
        self._compression = check_compression(value)
        self._refresh_full_band()

    @property
    def algorithm(self) -> str:
        return self._algorithm

    @algorithm.setter
    def algorithm(self, value: str) -> None:
        self._algorithm = check_algorithm(value)
        self._refresh_full_band()

    def _refresh_full_band(self) -> None:
        """Decide, once per change of the compression or the algorithm, whether every forward
        pass runs the native convolution (see the class docstring)."""
        full = self._compression == 0 and self._algorithm == "auto" and native_geometry(self)  # type: ignore[arg-type]
        self._full_band = full
        if full:
            disengage(self)

    @classmethod
    def from_conv(
        cls: type[_Self], conv: nn.Module, compression: float = 0.0, memory_lean: bool = True
    ) -> _Self:
        """A band-limited twin of ``conv`` that shares its ``Parameter`` objects.

        A shallow copy of ``conv`` (containers copied, so hooks, buffers and train/eval mode
        carry over and a new ``Parameter`` on the twin does not leak back), converted in place by
        :func:`swap_to_bandlimited`, the one module swap of the package (what
        :func:`~lightning_bandlimit.layers.surgery.bandlimit` does to a model's own modules; call that to
        convert a model, and ``unbandlimit`` to turn it back).

        Args:
            conv: an ``nn.Conv2d`` (for :class:`BandLimitedConv2d`) or ``nn.Conv1d``, exactly.
            compression: the twin's compression, in ``[0, 1)``.
            memory_lean: the twin's ``memory_lean`` (see the class attributes).

        Raises:
            TypeError: if ``conv`` is not a plain convolution of the matching dimensionality,
                or as ``bandlimit``.
            ValueError: if ``compression`` is outside ``[0, 1)``.

        Example:
            >>> conv = nn.Conv2d(3, 8, 3, padding=1)
            >>> twin = BandLimitedConv2d.from_conv(conv, compression=0.5)
            >>> twin.weight is conv.weight, twin.compression
            (True, 0.5)
        """
        if type(conv) is not cls._plain:
            raise TypeError(
                f"{cls.__name__}.from_conv expects an {cls._plain.__module__}.{cls._plain.__name__} "
                f"(not a subclass), got {type(conv).__name__}"
            )
        compression, memory_lean = check_compression(compression), check_bool("memory_lean", memory_lean)
        return swap_to_bandlimited(_twin(conv, cls._plain), compression, memory_lean)  # type: ignore[return-value]

    def extra_repr(self) -> str:
        lean = "" if self.memory_lean else ", memory_lean=False"
        algorithm = "" if self._algorithm == "auto" else f", algorithm={self._algorithm!r}"
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
        TypeError: if ``compression`` is not a real number or ``memory_lean`` not a bool.
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
        TypeError, ValueError: as :class:`BandLimitedConv2d`.

    Example:
        >>> layer = BandLimitedConv1d(2, 4, kernel_size=5, padding="same", compression=0.75)
        >>> layer(torch.randn(1, 2, 100)).shape
        torch.Size([1, 4, 100])
    """

    _plain = nn.Conv1d


BANDLIMITED_TWINS: dict[type[nn.Module], type[BandLimitedConvNd]] = {
    nn.Conv1d: BandLimitedConv1d,
    nn.Conv2d: BandLimitedConv2d,
}
"""The band-limited twin of each plain convolution class (exact types; subclasses have none)."""


def swap_to_bandlimited(conv: nn.Module, compression: float, memory_lean: bool) -> BandLimitedConvNd:
    """Turn ``conv`` (exactly an ``nn.Conv1d`` / ``nn.Conv2d``) into its band-limited twin, in place.

    The object stays: only its class changes and the band-limited attributes are added, so
    parameters, buffers, hooks and any reference to it stay valid. The swap behind
    :func:`~lightning_bandlimit.layers.surgery.bandlimit` and :meth:`BandLimitedConvNd.from_conv`; it
    trusts its arguments (its callers check them).
    """
    conv.__class__ = BANDLIMITED_TWINS[type(conv)]
    layer: BandLimitedConvNd = conv  # type: ignore[assignment]
    layer._compression, layer.memory_lean, layer.achieved_compression = compression, memory_lean, None
    layer._refresh_full_band()
    return layer


def swap_to_plain(layer: BandLimitedConvNd) -> nn.Module:
    """The exact inverse of :func:`swap_to_bandlimited`: the same object, its plain class again."""
    disengage(layer)
    for attribute in _BANDLIMIT_ATTRIBUTES:
        layer.__dict__.pop(attribute, None)
    layer.__class__ = layer._plain  # type: ignore[assignment]
    return layer  # type: ignore[return-value]
