"""What a registered attack is: its threat, norm, meaning of ``eps``, options and builder.

:class:`AttackInfo` is one entry of the registry
(:data:`~lightning_bandlimit.recipes.threats.attack_registry.ATTACKS`); :class:`Threat` says
what an attack threatens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from torchattacks.attack import Attack

__all__ = ["THREAT_BAND", "THREAT_FULL", "THREAT_NOISE", "AttackInfo", "Builder", "Threat"]


class Threat(str, Enum):
    """What an attack threatens; a ``str`` (records and JSON keep the plain values).

    Example:
        >>> Threat.FULL == "full-spectrum white-box", f"{Threat.NOISE}", Threat("random noise").name
        (True, 'random noise', 'NOISE')
    """

    FULL = "full-spectrum white-box"
    BAND = "band-restricted white-box"
    NOISE = "random noise"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


THREAT_FULL = Threat.FULL
THREAT_BAND = Threat.BAND
THREAT_NOISE = Threat.NOISE
_NORMS = ("Linf", "L2", None)

#: ``build(model, eps, *, num_classes, seed, band, options) -> Attack``; ``options`` are the
#: entry's defaults updated with the spec's options.
Builder = Callable[..., Attack]


@dataclass(frozen=True)
class AttackInfo:
    """A registered attack: how to build it and what its results mean.

    Args:
        name: the registry key.
        build: ``build(model, eps, *, num_classes, seed, band, options) -> torchattacks.Attack``.
        norm: ``"Linf"``, ``"L2"`` or ``None`` (random noise), the default threat norm.
        threat: a :class:`Threat` (or its value: ``"full-spectrum white-box"``, ...).
        iterative: whether accuracy must be non-increasing in ``eps`` (sanity check).
        eps_meaning: what ``eps`` is, in words.
        defaults: the accepted options and their full-strength defaults.
        banded: whether the attack takes a frequency ``band``.
        minimum_norm: a minimum-norm attack run once and evaluated at every ``eps`` (``cw``).

    Raises:
        ValueError: for an unknown norm or threat.
    """

    name: str
    build: Builder
    norm: str | None
    threat: Threat
    iterative: bool
    eps_meaning: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    banded: bool = False
    minimum_norm: bool = False

    def __post_init__(self) -> None:
        threats = tuple(t.value for t in Threat)
        if self.norm not in _NORMS or self.threat not in threats:
            raise ValueError(
                f"expected norm in {_NORMS} and threat in {threats}, got {self.norm!r} and {self.threat!r}"
            )
        object.__setattr__(self, "threat", Threat(self.threat))

    def resolve_norm(self, options: Mapping[str, Any]) -> str | None:
        """The norm of a run: the ``norm`` option where the attack takes one, else :attr:`norm`."""
        return options.get("norm", self.norm) if "norm" in self.defaults else self.norm
