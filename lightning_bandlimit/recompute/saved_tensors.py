"""Measure the memory autograd keeps for the backward pass (activation memory).

Counts unique storages, not references: a ReLU output that the next convolution also saves is
one tensor in memory. Parameters are left out by default: they are alive anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from types import TracebackType

import torch

__all__ = ["SavedTensorMeter", "saved_activation_bytes"]


class SavedTensorMeter:
    """Context manager that sums the bytes of the unique storages saved for backward.

    Args:
        exclude: tensors whose storages are not counted (by default: none; pass
            ``model.parameters()`` to measure activations only).
        label: called as each storage is first saved; what it returns (e.g. the module running
            then) groups the bytes in :attr:`bytes_by_label`.

    Example:
        >>> from torch import nn
        >>> conv = nn.Conv2d(3, 8, 3)
        >>> x = torch.randn(4, 3, 16, 16, requires_grad=True)
        >>> with SavedTensorMeter(exclude=conv.parameters()) as meter:
        ...     out = conv(x)
        >>> meter.bytes == x.nelement() * x.element_size()  # conv saves its input
        True
    """

    def __init__(
        self, exclude: Iterable[torch.Tensor] = (), label: Callable[[], Hashable] | None = None
    ) -> None:
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self._storages: dict[int, int] = {}
        self._label = label
        self._labels: dict[int, Hashable] = {}
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None

    @property
    def bytes(self) -> int:
        """Total bytes of the unique storages saved so far."""
        return sum(self._storages.values())

    @property
    def bytes_by_label(self) -> dict[Hashable, int]:
        """Bytes of the unique storages saved so far, grouped by ``label()`` at their first save."""
        grouped: dict[Hashable, int] = {}
        for pointer, size in self._storages.items():
            key = self._labels.get(pointer)
            grouped[key] = grouped.get(key, 0) + size
        return grouped

    def storages_by_label(self) -> dict[Hashable, dict[int, int]]:
        """The unique storages saved so far (``data_ptr -> bytes``), grouped as :attr:`bytes_by_label`."""
        grouped: dict[Hashable, dict[int, int]] = {}
        for pointer, size in self._storages.items():
            grouped.setdefault(self._labels.get(pointer), {})[pointer] = size
        return grouped

    @property
    def count(self) -> int:
        """Number of unique storages saved so far."""
        return len(self._storages)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in self._excluded:
            if self._label is not None and pointer not in self._storages:
                self._labels[pointer] = self._label()
            self._storages[pointer] = storage.nbytes()
        # Detached: a saved tensor that kept its graph would make the graph hold itself through
        # autograd's C++ nodes, a cycle Python's collector cannot see; a forward whose backward
        # never runs (it raised, the step was skipped) would then keep the model alive for good.
        return tensor.detach()

    def __enter__(self) -> SavedTensorMeter:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._hooks is not None
        self._hooks.__exit__(exc_type, exc, traceback)
        self._hooks = None


def saved_activation_bytes(
    model: torch.nn.Module, *inputs: torch.Tensor, within: Iterable[torch.nn.Module] | None = None
) -> int:
    """Bytes autograd saves for backward in one forward of ``model(*inputs)``, parameters excluded.

    Args:
        model: the model (run as it is: put it in train mode first to measure training).
        *inputs: its inputs.
        within: count only tensors saved inside these modules' own forward passes (e.g. the
            convolutions), not those of the ops around them.

    Example:
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
        >>> x = torch.randn(2, 3, 8, 8)
        >>> saved_activation_bytes(model, x, within=[model[0]]) == x.nelement() * 4
        True
    """
    meter = SavedTensorMeter(exclude=model.parameters())
    if within is None:
        with meter:
            model(*inputs)
        return meter.bytes

    def start(*_: object) -> None:
        meter.__enter__()

    def stop(*_: object) -> None:
        meter.__exit__(None, None, None)

    modules = list(within)
    handles = [m.register_forward_pre_hook(start) for m in modules]
    handles += [m.register_forward_hook(stop) for m in modules]
    try:
        model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return meter.bytes
