"""The attack registry: :data:`ATTACKS` maps a name to its :class:`AttackInfo`.

The registry starts as the built-in attacks
(:data:`~lightning_bandlimit.recipes.threats.attack_builders.BUILT_IN_ATTACKS`, listed there);
custom attacks are added with :func:`register_attack` (or for a while, e.g. in a test, with
:func:`registered_attack`) and removed with :func:`unregister_attack`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

from lightning_bandlimit.recipes.threats.attack_builders import BUILT_IN_ATTACKS
from lightning_bandlimit.recipes.threats.attack_info import AttackInfo

__all__ = ["ATTACKS", "attack_names", "register_attack", "registered_attack", "unregister_attack"]

#: attack name -> :class:`AttackInfo`, starting with the built-ins (changed only by the functions below).
_REGISTRY: dict[str, AttackInfo] = {info.name: info for info in BUILT_IN_ATTACKS}
#: The registry, read-only: attack name -> :class:`AttackInfo`.
ATTACKS: Mapping[str, AttackInfo] = MappingProxyType(_REGISTRY)


def register_attack(info: AttackInfo, *, replace: bool = False) -> AttackInfo:
    """Add a custom attack to :data:`ATTACKS`.

    Args:
        info: the attack's entry.
        replace: allow replacing an entry of the same name.

    Returns:
        ``info``.

    Raises:
        ValueError: if the name is taken and ``replace`` is false.

    Example:
        >>> from lightning_bandlimit.recipes.threats.attack_info import Threat
        >>> info = AttackInfo(
        ...     "fgsm_copy", ATTACKS["fgsm"].build, "Linf", Threat.FULL,
        ...     iterative=False, eps_meaning="L-inf step",
        ... )
        >>> register_attack(info).name in ATTACKS
        True
        >>> unregister_attack("fgsm_copy") is info, "fgsm_copy" in ATTACKS
        (True, False)
    """
    if info.name in _REGISTRY and not replace:
        raise ValueError(
            f"an attack named {info.name!r} is registered already; pass replace=True to replace it"
        )
    _REGISTRY[info.name] = info
    return info


def unregister_attack(name: str) -> AttackInfo:
    """Remove an attack from :data:`ATTACKS` and return its entry.

    Raises:
        KeyError: if no attack of that name is registered.
    """
    if name not in _REGISTRY:
        raise KeyError(f"no attack named {name!r} is registered; registered: {', '.join(attack_names())}")
    return _REGISTRY.pop(name)


@contextmanager
def registered_attack(info: AttackInfo, *, replace: bool = False) -> Iterator[AttackInfo]:
    """Register ``info`` while the ``with`` block runs, then restore the registry as it was
    (the replaced entry comes back when ``replace`` replaced one).

    Example:
        >>> from lightning_bandlimit.recipes.threats.attack_info import Threat
        >>> info = AttackInfo("noise_copy", ATTACKS["gaussian_noise"].build, None, Threat.NOISE,
        ...                   iterative=False, eps_meaning="std")
        >>> with registered_attack(info):
        ...     "noise_copy" in ATTACKS
        True
        >>> "noise_copy" in ATTACKS
        False
    """
    previous = _REGISTRY.get(info.name)
    register_attack(info, replace=replace)
    try:
        yield info
    finally:
        if previous is None:
            _REGISTRY.pop(info.name, None)
        else:
            _REGISTRY[info.name] = previous


def attack_names() -> list[str]:
    """The registered attack names, sorted.

    Example:
        >>> attack_names()[:3]
        ['autoattack', 'band_noise', 'band_pgd']
    """
    return sorted(_REGISTRY)
