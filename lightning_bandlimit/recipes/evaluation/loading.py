"""The classifiers a robustness evaluation compares: modules as given, checkpoints as trained.

A module is taken as it is (it must be in eval mode); a checkpoint of our
:class:`~lightning_bandlimit.models.ImageClassifier` is loaded and band-limited again as the
``BandLimit`` / ``AdaptiveBandLimit`` callback saved it
(:func:`~lightning_bandlimit.callbacks.band_limit_checkpoint.band_limit_states`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lightning_bandlimit.callbacks.band_limit_checkpoint import (
    band_limit_states,
    bandlimit_as_saved,
    compression_from_checkpoint,
)
from lightning_bandlimit.models import ImageClassifier

__all__ = ["LoadedClassifier", "Source", "load_classifier", "load_source", "resolve_device"]

#: What a model to evaluate is given as: a module, or the path of an ImageClassifier checkpoint.
Source = nn.Module | str | Path


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` (CUDA when available, else CPU) or an explicit device.

    Args:
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ... or a ``torch.device``.

    Raises:
        ValueError: for an unparsable device, or CUDA when it is not available.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"expected device 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; expected 'auto' or 'cpu'")
    return resolved


@dataclass(frozen=True)
class LoadedClassifier:
    """A classifier ready to evaluate, and where it came from.

    Args:
        module: the model, in eval mode on the evaluation's device.
        source: where it came from, in words (the checkpoint path, or ``nn.Module <class>``).
        band_limit_states: the ``BandLimit`` states its checkpoint saved (empty for a module).
        compression: the compression it was trained at (``None`` when not band-limited).
    """

    module: nn.Module
    source: str
    band_limit_states: list[dict[str, Any]] = field(default_factory=list)
    compression: float | None = None


def _training_modules(model: nn.Module) -> list[str]:
    return [name or "<root>" for name, module in model.named_modules() if module.training]


def _module_in_eval_mode(module: nn.Module, device: str | torch.device) -> nn.Module:
    training = _training_modules(module)
    if training:
        shown = ", ".join(training[:5]) + (", ..." if len(training) > 5 else "")
        raise ValueError(
            "expected a model in eval mode (call model.eval() first: attacks and BatchNorm statistics "
            f"need it), got {type(module).__name__} with {len(training)} module(s) in training mode: "
            f"{shown}"
        )
    return module.to(resolve_device(device))


def _checkpoint_as_trained(source: Any, device: str | torch.device) -> LoadedClassifier:
    if not isinstance(source, (str, Path)):
        raise TypeError(f"expected an nn.Module or a checkpoint path, got {type(source).__name__}")
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {str(path)!r}")
    resolved = resolve_device(device)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    states = band_limit_states(checkpoint)
    model = ImageClassifier.load_from_checkpoint(path, map_location=resolved)
    bandlimit_as_saved(model, states)
    compression = compression_from_checkpoint(checkpoint)
    return LoadedClassifier(model.eval(), str(source), states, compression)


def load_source(source: Source, device: str | torch.device = "cpu") -> LoadedClassifier:
    """Load a classifier to evaluate, with what its checkpoint says about its band limit.

    Args:
        source: an ``nn.Module`` in eval mode, or the path of an ``ImageClassifier`` checkpoint.
        device: where to put the model.

    Raises:
        ValueError: for a module (or submodule) in training mode.
        FileNotFoundError: for a checkpoint path that is not a file.
        TypeError: for anything else.

    Example:
        >>> loaded = load_source(nn.Linear(2, 2).eval())
        >>> loaded.source, loaded.compression
        ('nn.Module Linear', None)
    """
    if isinstance(source, nn.Module):
        return LoadedClassifier(_module_in_eval_mode(source, device), f"nn.Module {type(source).__name__}")
    return _checkpoint_as_trained(source, device)


def load_classifier(source: str | Path | nn.Module, device: str | torch.device = "cpu") -> nn.Module:
    """A classifier to evaluate: a module as is, or an ``ImageClassifier`` checkpoint band-limited as trained.

    A checkpoint is loaded with ``ImageClassifier.load_from_checkpoint``; when its callback
    states hold a ``BandLimit`` / ``AdaptiveBandLimit`` entry with ``compression > 0`` (whose
    state records ``include``, ``exclude`` and ``pointwise``), the same convolutions are
    band-limited again at that compression, so the model is evaluated as it was trained. The
    result is in eval mode on ``device``.

    Args:
        source: an ``nn.Module`` (must be in eval mode already; it is moved to ``device``) or
            the path of a Lightning checkpoint of an ``ImageClassifier``.
        device: where to put the model.

    Raises:
        ValueError: for a module (or submodule) in training mode.
        FileNotFoundError: for a checkpoint path that is not a file.
        TypeError: for anything else.

    Example:
        >>> load_classifier(nn.Linear(2, 2))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: expected a model in eval mode (...), got Linear with 1 module(s) in training mode: <root>
    """
    return load_source(source, device).module
