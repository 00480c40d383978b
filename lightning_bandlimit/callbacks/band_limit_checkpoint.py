"""What a ``BandLimit`` / ``AdaptiveBandLimit`` saved in a Lightning checkpoint, read back outside a
Trainer: its states (:func:`band_limit_states`), the compression the model was saved at
(:func:`compression_from_checkpoint`), and the model band-limited as it was trained
(:func:`bandlimit_as_saved`), e.g. for the robustness recipe's evaluation."""

from __future__ import annotations

from typing import Any

from torch import nn

from lightning_bandlimit.layers.surgery import bandlimit

__all__ = ["band_limit_states", "bandlimit_as_saved", "compression_from_checkpoint"]


# A callback's checkpoint entry is keyed by its ``state_key``: the class name, then its include /
# exclude patterns. ``AdaptiveBandLimit`` (a subclass, in another module) saves the same fields.
_STATE_KEY_PREFIXES = ("BandLimit", "AdaptiveBandLimit")


def band_limit_states(checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    """The states a ``BandLimit`` / ``AdaptiveBandLimit`` saved in a Lightning checkpoint.

    Each is the callback's :meth:`~lightning_bandlimit.callbacks.BandLimit.state_dict`:
    ``compression``, ``include``, ``exclude`` and ``pointwise`` (``AdaptiveBandLimit`` adds its
    controller's state).

    Args:
        checkpoint: a loaded Lightning checkpoint (``torch.load`` of a ``.ckpt``).

    Returns:
        The states, in the checkpoint's order (empty when no such callback was used).

    Example:
        >>> key = "BandLimit{'include': None, 'exclude': None}"
        >>> band_limit_states({"callbacks": {key: {"compression": 0.5}}})
        [{'compression': 0.5}]
        >>> band_limit_states({})
        []
    """
    callbacks = checkpoint.get("callbacks") or {}
    return [dict(state) for key, state in callbacks.items() if str(key).startswith(_STATE_KEY_PREFIXES)]


def compression_from_checkpoint(checkpoint: dict[str, Any]) -> float | None:
    """The compression a checkpoint's model was band-limited at when it was saved.

    Args:
        checkpoint: a loaded Lightning checkpoint.

    Returns:
        The largest compression of its ``BandLimit`` / ``AdaptiveBandLimit`` states, or ``None``
        when it holds none.

    Example:
        >>> compression_from_checkpoint({"callbacks": {"AdaptiveBandLimit{}": {"compression": 0.3}}})
        0.3
        >>> print(compression_from_checkpoint({"callbacks": {"ModelCheckpoint{}": {}}}))
        None
    """
    states = band_limit_states(checkpoint)
    if not states:
        return None
    return max(float(state.get("compression", 0.0)) for state in states)


def bandlimit_as_saved(model: nn.Module, states: list[dict[str, Any]]) -> nn.Module:
    """Band-limit ``model``'s convolutions as saved ``BandLimit`` states say (in place).

    Every state with ``compression > 0`` band-limits the convolutions its ``include`` /
    ``exclude`` / ``pointwise`` selected when it was trained, so a checkpoint is evaluated as
    it was trained.

    Args:
        model: the model loaded from the checkpoint.
        states: :func:`band_limit_states` of that checkpoint.

    Returns:
        ``model``.

    Example:
        >>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Conv2d(2, 2, 3))
        >>> _ = bandlimit_as_saved(model, [{"compression": 0.5, "exclude": ["1"]}])
        >>> [type(m).__name__ for m in model]
        ['BandLimitedConv2d', 'Conv2d']
    """
    for state in states:
        compression = float(state.get("compression", 0.0))
        if compression > 0:
            bandlimit(
                model,
                compression,
                include=state.get("include"),
                exclude=state.get("exclude"),
                pointwise=bool(state.get("pointwise", False)),
            )
    return model
