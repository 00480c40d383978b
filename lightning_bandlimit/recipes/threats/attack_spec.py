"""Attack specifications: a registered attack, its budgets, band and options, checked before any work.

An :class:`AttackSpec` names an entry of :data:`~lightning_bandlimit.recipes.threats.attack_registry.ATTACKS`;
the ``spec_*`` functions resolve what a run of it means (norm, band, options),
:func:`validate_attack_specs` checks a list of them and :func:`build_attack` builds one run.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from fractions import Fraction
from typing import Any

from torch import nn
from torchattacks.attack import Attack

from lightning_bandlimit.recipes.threats.attack_info import AttackInfo
from lightning_bandlimit.recipes.threats.attack_registry import ATTACKS, attack_names
from lightning_bandlimit.recipes.threats.frequency_band import resolve_band
from lightning_bandlimit.recipes.threats.input_band import MODEL_BANDS, BandSubspace

__all__ = [
    "AttackSpec",
    "build_attack",
    "derive_seed",
    "spec_band",
    "spec_band_name",
    "spec_model_band",
    "spec_norm",
    "spec_options",
    "validate_attack_specs",
]


def _parse_eps(value: Any) -> float:
    if not isinstance(value, str):  # a type check only: the range is checked by validate_attack_specs
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(
                f"eps must be a number or a fraction such as '8/255', got {value!r} ({type(value).__name__})"
            )
        return float(value)
    try:
        return float(Fraction(value.strip()))
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"eps must be a number or a fraction such as '8/255', got {value!r}") from None


@dataclass
class AttackSpec:
    """One attack of a robustness evaluation: a registered name, a list of budgets, options.

    Args:
        name: a key of :data:`ATTACKS` (``"pgd"``, ``"autoattack"``, ...).
        eps: the budgets to evaluate, each giving one point of the accuracy-vs-eps curve;
            numbers, or fractions written as strings (``"8/255"``, handy in YAML). Include 0 to
            run the eps = 0 sanity check.
        band: the frequency band of a ``band_*`` attack: a radial band (a name in
            :data:`~lightning_bandlimit.recipes.threats.frequency_band.BANDS` or ``[low, high]``,
            default ``"high"``), or a band defined by a model's input layer: ``"dropped"`` (what
            it ignores) or ``"kept"`` (its box), see :mod:`~lightning_bandlimit.recipes.threats.input_band`;
            must be ``None`` for the other attacks.
        options: constructor arguments overriding the entry's full-strength defaults (e.g.
            ``{"steps": 20}``); the accepted names are the keys of the entry's ``defaults``.
        label: the name used in the report (default: ``name``, plus the band for band attacks);
            labels must be unique within an evaluation.
        band_of: for ``band: dropped | kept``, the evaluated model (or variant) whose input layer
            defines the band, applied to every model so that all face the same perturbations;
            default: the one band-limited model of the evaluation.

    Raises:
        TypeError: if an ``eps`` is neither a number nor a string (a ``bool`` is not a number).
        ValueError: if an ``eps`` string is not a fraction.

    Example:
        >>> spec = AttackSpec("pgd", eps=[0, "8/255"], options={"steps": 20})
        >>> spec.eps[1] == 8 / 255, spec.key
        (True, 'pgd')
        >>> AttackSpec("band_pgd", eps=[0.03], band="high").key
        'band_pgd[high]'
    """

    name: str
    eps: list[float | str]
    band: str | list[float] | None = None
    options: dict[str, Any] = field(default_factory=dict)
    label: str | None = None
    band_of: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.eps, (int, float, str)):
            self.eps = [self.eps]
        if not isinstance(self.eps, Iterable):
            raise ValueError(f"eps must be a list of budgets, got {self.eps!r}")
        self.eps = [_parse_eps(e) for e in self.eps]
        if isinstance(self.band, tuple):
            self.band = list(self.band)
        if self.options is None:
            self.options = {}

    @property
    def key(self) -> str:
        """The attack's name in the report: ``label``, else ``name`` (plus ``[band]`` for band attacks)."""
        if self.label:
            return self.label
        banded = self.name in ATTACKS and ATTACKS[self.name].banded
        if self.band is None and not banded:
            return self.name
        if self.band is None or isinstance(self.band, str):
            band = self.band or "high"
            if self.band_of and band in MODEL_BANDS:
                band = f"{band}@{self.band_of}"
        else:
            band = "-".join(f"{float(b):g}" for b in self.band)
        return f"{self.name}[{band}]"


def derive_seed(seed: int, *parts: object) -> int:
    """A stable 31-bit seed from ``seed`` and labels (same inputs, same seed, on every machine).

    Args:
        seed: the evaluation seed.
        *parts: what distinguishes the run (attack label, eps, ...), turned into text.

    Example:
        >>> derive_seed(0, "pgd", 0.5) == derive_seed(0, "pgd", 0.5) != derive_seed(1, "pgd", 0.5)
        True
    """
    text = "|".join([str(int(seed)), *(repr(p) for p in parts)])
    return zlib.crc32(text.encode()) & 0x7FFF_FFFF


def _radial_band(spec: AttackSpec, info: AttackInfo) -> tuple[float, float] | None:
    if not info.banded or spec.band in MODEL_BANDS:
        return None
    return resolve_band("high" if spec.band is None else spec.band)  # type: ignore[arg-type]


def _options(spec: AttackSpec, info: AttackInfo) -> dict[str, Any]:
    return {**info.defaults, **spec.options}


def spec_band(spec: AttackSpec) -> tuple[float, float] | None:
    """The resolved radial ``(low, high)`` band of a band attack (default ``"high"``), else ``None``
    (also for a model's band, see :func:`spec_model_band`).

    Raises:
        ValueError: for an unknown attack name or an invalid band.

    Example:
        >>> spec_band(AttackSpec("band_noise", eps=[0.1])), spec_band(AttackSpec("pgd", eps=[0.1]))
        ((0.5, 1.0), None)
    """
    return _radial_band(spec, _info(spec))


def spec_model_band(spec: AttackSpec) -> str | None:
    """``"dropped"`` or ``"kept"`` when the band is defined by a model's input layer, else ``None``.

    Example:
        >>> spec_model_band(AttackSpec("band_noise", eps=[0.1], band="dropped"))
        'dropped'
    """
    return spec.band if _info(spec).banded and spec.band in MODEL_BANDS else None  # type: ignore[return-value]


def spec_band_name(spec: AttackSpec) -> str | None:
    """The band's name when it was given by name (or defaulted to ``"high"``), else ``None``.

    Example:
        >>> spec_band_name(AttackSpec("band_pgd", eps=[0.1]))
        'high'
        >>> print(spec_band_name(AttackSpec("band_pgd", eps=[0.1], band=[0, 0.2])))
        None
    """
    if not _info(spec).banded:
        return None
    return "high" if spec.band is None else spec.band if isinstance(spec.band, str) else None


def spec_options(spec: AttackSpec) -> dict[str, Any]:
    """The constructor options of a run: the entry's full-strength defaults updated with ``spec.options``.

    Example:
        >>> spec_options(AttackSpec("pgd", eps=[0.1], options={"steps": 7}))
        {'steps': 7, 'alpha': None, 'random_start': True}
    """
    return _options(spec, _info(spec))


def spec_norm(spec: AttackSpec) -> str | None:
    """The threat norm of a run (``"Linf"``, ``"L2"``, or ``None`` for Gaussian noise).

    Example:
        >>> spec_norm(AttackSpec("autoattack", eps=[0.5], options={"norm": "L2"}))
        'L2'
    """
    info = _info(spec)
    return info.resolve_norm(_options(spec, info))


def _info(spec: AttackSpec) -> AttackInfo:
    if spec.name not in ATTACKS:
        raise ValueError(f"unknown attack {spec.name!r}; expected one of: {', '.join(attack_names())}")
    return ATTACKS[spec.name]


def validate_attack_specs(specs: Sequence[AttackSpec | Mapping[str, Any]]) -> list[AttackSpec]:
    """Check attack specifications before any work; mappings are turned into :class:`AttackSpec`.

    Args:
        specs: the attacks of an evaluation (at least one).

    Returns:
        The specifications as :class:`AttackSpec` objects, in order.

    Raises:
        ValueError: for no attacks, a mapping with unknown or missing fields, an unknown name
            (the message lists the valid ones), an empty, negative, non-finite or repeated
            ``eps`` (or an L-inf ``eps`` above 1), a band on an attack without one or an invalid
            band, an unknown option (the message lists the accepted ones), or two attacks with
            the same label.

    Example:
        >>> validate_attack_specs([{"name": "fgsm", "eps": [0, "8/255"]}])[0].eps[0]
        0.0
        >>> validate_attack_specs([AttackSpec("fgsn", eps=[0.1])])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: unknown attack 'fgsn'; expected one of: autoattack, band_noise, ..., pgd, pgd_l2
    """
    if isinstance(specs, (str, bytes, Mapping, AttackSpec)) or not isinstance(specs, Sequence) or not specs:
        raise ValueError(f"expected a non-empty list of attack specifications, got {specs!r}")
    checked: list[AttackSpec] = []
    for spec in specs:
        if isinstance(spec, Mapping):
            known = [f.name for f in fields(AttackSpec)]
            unknown = sorted(set(map(str, spec)) - set(known))
            if unknown or "name" not in spec or "eps" not in spec:
                raise ValueError(
                    f"expected an attack with the fields name, eps and optionally {', '.join(known[2:])}, "
                    f"got {dict(spec)!r}" + (f" (unknown: {', '.join(unknown)})" if unknown else "")
                )
            spec = AttackSpec(**spec)
        if not isinstance(spec, AttackSpec):
            raise ValueError(f"expected an AttackSpec or a mapping of its fields, got {spec!r}")
        if spec.name not in ATTACKS:
            raise ValueError(f"unknown attack {spec.name!r}; expected one of: {', '.join(attack_names())}")
        info = ATTACKS[spec.name]
        unknown = sorted(set(spec.options) - set(info.defaults))
        if unknown:
            accepted = ", ".join(sorted(info.defaults)) or "none"
            raise ValueError(
                f"attack {spec.name!r}: unknown options {unknown}; accepted: {accepted} "
                "(eps comes from the eps list)"
            )
        norm = info.resolve_norm(_options(spec, info))
        if norm not in ("Linf", "L2") and (norm is not None or info.norm is not None):
            raise ValueError(f"attack {spec.name!r}: expected norm 'Linf' or 'L2', got {norm!r}")
        eps = spec.eps
        if not eps or any(not math.isfinite(e) or e < 0 for e in eps) or len(set(eps)) != len(eps):
            raise ValueError(
                f"attack {spec.key!r}: expected a non-empty list of distinct finite eps >= 0, "
                f"got {spec.eps!r}"
            )
        if norm == "Linf" and max(eps) > 1:
            raise ValueError(
                f"attack {spec.key!r}: an L-inf eps above 1 exceeds the [0, 1] image range, got {max(eps)}"
            )
        if spec.band_of is not None and (not isinstance(spec.band_of, str) or spec.band not in MODEL_BANDS):
            raise ValueError(
                f"attack {spec.key!r}: band_of names the model whose band is {list(MODEL_BANDS)}, so it "
                "needs "
                f"band: dropped or kept and a model name, got band={spec.band!r}, band_of={spec.band_of!r}"
            )
        if info.banded:
            try:
                _radial_band(spec, info)
            except (TypeError, ValueError) as error:  # name the model bands too
                raise type(error)(f"{error}; or a model's band: {', '.join(MODEL_BANDS)}") from None
        elif spec.band is not None:
            raise ValueError(
                f"attack {spec.name!r} takes no band (band attacks: "
                f"{', '.join(n for n in attack_names() if ATTACKS[n].banded)}), got band={spec.band!r}"
            )
        checked.append(spec)
    keys = [s.key for s in checked]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(
            f"attack labels must be unique, got {repeated} more than once; set label= to tell them apart"
        )
    return checked


def build_attack(
    spec: AttackSpec,
    model: nn.Module,
    eps: float,
    *,
    num_classes: int,
    seed: int,
    subspace: BandSubspace | None = None,
) -> Attack:
    """Build the configured torchattacks attack of ``spec`` for one budget.

    Args:
        spec: a validated specification (:func:`validate_attack_specs`).
        model: the model to attack (eval mode, ``[0, 1]`` images in, logits out).
        eps: the budget (ignored by minimum-norm attacks, see :attr:`AttackInfo.minimum_norm`).
        num_classes: the model's number of output logits.
        seed: the run's seed (see :func:`derive_seed`), passed to attacks that take one.
        subspace: for ``band: dropped | kept``, that part of the source model's
            :class:`~lightning_bandlimit.recipes.threats.input_band.InputBand`.

    Raises:
        TypeError: for an option of the wrong type (e.g. a float number of steps).
        ValueError: for an unknown name, an option out of range, or a model band without its
            ``subspace`` (or of another part).

    Example:
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(12, 10)).eval()
        >>> spec = AttackSpec("autoattack", eps=[8 / 255])
        >>> attack = build_attack(spec, model, 8 / 255, num_classes=10, seed=3)
        >>> [(type(a).__name__, getattr(a, "steps", None), a.seed) for a in attack._autoattack.attacks]
        [('APGD', 100, 3), ('APGDT', 100, 3), ('FAB', 100, 3), ('Square', None, 3)]
    """
    info = _info(spec)
    band: tuple[float, float] | BandSubspace | None = _radial_band(spec, info)  # a radial band, or:
    part = spec_model_band(spec)
    if part is not None:
        if not isinstance(subspace, BandSubspace) or subspace.part != part:
            raise ValueError(
                f"attack {spec.key!r}: band {part!r} is a model's; expected the subspace "
                f"InputBand.{part} of its source model, got {subspace!r}"
            )
        band = subspace
    return info.build(
        model,
        float(eps),
        num_classes=int(num_classes),
        seed=int(seed),
        band=band,
        options=_options(spec, info),
    )
