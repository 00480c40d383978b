"""The registry of scaling rules: every rule by its :attr:`~ScalingRule.name`."""

from __future__ import annotations

from typing import Any

from lightning_bandlimit.strategies.adascale import AdaScale
from lightning_bandlimit.strategies.exact_global_batch import ExactGlobalBatch
from lightning_bandlimit.strategies.rules import (
    KeepGlobalBatch,
    LinearScaling,
    MomentumAwareScaling,
    NoScaling,
    SquareRootScaling,
)
from lightning_bandlimit.strategies.scaling_rule import ScalingRule
from lightning_bandlimit.utils.validation import check_choice

__all__ = ["rule_from_name", "rule_names"]

_RULES: tuple[type[ScalingRule], ...] = (
    NoScaling,
    LinearScaling,
    KeepGlobalBatch,
    MomentumAwareScaling,
    AdaScale,
    SquareRootScaling,
    ExactGlobalBatch,
)


def rule_names() -> tuple[str, ...]:
    """The :attr:`ScalingRule.name` of every rule of the package.

    Example:
        >>> rule_names()
        ('none', 'linear', 'keep-global-batch', 'momentum', 'adascale', 'sqrt', 'exact-global-batch')
    """
    return tuple(rule.name for rule in _RULES)


def rule_from_name(name: str, **kwargs: Any) -> ScalingRule:
    """The rule whose :attr:`ScalingRule.name` is ``name``, constructed with ``kwargs``.

    Args:
        name: one of :func:`rule_names`.
        **kwargs: the rule's arguments (e.g. ``warmup_steps`` for ``"linear"``;
            ``"exact-global-batch"`` needs ``global_batch`` and ``micro_batches`` or ``max_micro_batch``).

    Raises:
        ValueError: for an unknown name.

    Example:
        >>> rule_from_name("linear", warmup_steps=0)
        LinearScaling()
        >>> rule_from_name("exact-global-batch", global_batch=128, micro_batches=[32, 64])
        ExactGlobalBatch(global_batch=128, micro_batches=[32, 64], max_accumulation=64, fallback=False)
    """
    check_choice("rule", name, rule_names())
    return next(rule for rule in _RULES if rule.name == name)(**kwargs)
