"""The attacks of the robustness recipe: names -> torchattacks builders at full strength.

Each entry of :data:`ATTACKS` says what it threatens and what its ``eps`` means, and builds a
configured ``torchattacks.Attack`` for one budget. Every attack expects images in ``[0, 1]``
and a model that maps them to ``(N, classes)`` logits with any normalisation *inside* the model
(never ``set_normalization_used``), in eval mode.

=================  ======  ============================  =========  =========================================
name               norm    threat                        iterative  ``eps`` is
=================  ======  ============================  =========  =========================================
``fgsm``           Linf    full-spectrum white-box       no         the L-inf step (= radius)
``pgd``            Linf    full-spectrum white-box       yes        the L-inf radius
``pgd_l2``         L2      full-spectrum white-box       yes        the L2 radius (all pixels and channels)
``cw``             L2      full-spectrum white-box       yes        an L2 budget for a minimum-norm attack
``autoattack``     Linf    full-spectrum white-box       yes        the radius (``norm`` option: Linf or L2)
``gaussian_noise`` --      random noise                  no         the noise's standard deviation
``band_pgd``       Linf    band-restricted white-box     yes        the L-inf radius of a band-only change
``band_pgd_l2``    L2      band-restricted white-box     yes        the L2 radius of a band-only change
``band_noise``     Linf    random noise                  no         the noise's L-inf amplitude (``norm``: L2)
=================  ======  ============================  =========  =========================================

Full-strength defaults (torchattacks' own defaults are weak for evaluation; ``options`` of an
:class:`AttackSpec` override them):

* ``pgd``, ``pgd_l2``, ``band_pgd``, ``band_pgd_l2``: 50 steps, step size
  ``alpha = 2.5 * eps / steps`` (Madry et al.), random start.
* ``cw``: torchattacks' C&W is a *minimum-norm* attack with no budget, one constant ``c`` and
  50 steps. Here it runs at each ``c`` of a grid (default ``0.1, 1, 10``; 100 Adam steps of
  ``lr = 0.01`` each) and keeps, per sample, the smallest-L2 misclassified example. It is then
  evaluated at an L2 budget ``eps`` by counting a sample as robust when it is misclassified
  by no example within ``eps``: it was correct under the attack or the attack needed more than
  ``eps``. One run therefore gives the whole ``eps`` curve (the ``eps`` list costs nothing
  extra). The original attack uses 9 binary-search steps over ``c`` and 10 000 iterations;
  raise ``c`` / ``steps`` for a stronger run.
* ``autoattack``: ``version="standard"`` (APGD-CE, APGD-T, FAB-T, Square), ``n_classes`` from
  the model's output width, an explicit seed, and the inner APGD / APGD-T / FAB step counts
  raised from torchattacks' 10 to the reference implementation's 100 (option ``steps``);
  Square keeps 5000 queries (``n_queries``); APGD-T / FAB-T target every other class
  (``n_target_classes``, default ``classes - 1``; the reference uses 9 on CIFAR-10).
* ``gaussian_noise``: ``torchattacks.GN`` with ``std = eps``, clipped to ``[0, 1]``.
* ``band_*``: from :mod:`lightning_bandlimit.recipes.band_attacks`; ``band`` is a name
  (``"low"``, ``"mid"``, ``"high"``, ``"full"``) or a ``(low, high)`` pair of normalised radial
  frequencies (default ``"high"``).

Seeds: every attack run gets its own seed from :func:`derive_seed` (the evaluation seed, the
attack's label and ``eps``), set with ``torch.manual_seed`` on a forked RNG by the recipe and
passed to the attacks that take one, so the same seed gives identical results.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any

import torch
import torchattacks
from torch import nn
from torchattacks.attack import Attack

from lightning_bandlimit.recipes.frequency_band import resolve_band
from lightning_bandlimit.recipes.input_band import MODEL_BANDS, BandSubspace

__all__ = [
    "ATTACKS",
    "THREAT_BAND",
    "THREAT_FULL",
    "THREAT_NOISE",
    "AttackInfo",
    "AttackSpec",
    "CWMinNorm",
    "attack_names",
    "build_attack",
    "derive_seed",
    "register_attack",
    "spec_band",
    "spec_band_name",
    "spec_model_band",
    "spec_norm",
    "spec_options",
    "validate_attack_specs",
]

THREAT_FULL = "full-spectrum white-box"
THREAT_BAND = "band-restricted white-box"
THREAT_NOISE = "random noise"
_THREATS = (THREAT_FULL, THREAT_BAND, THREAT_NOISE)
_NORMS = ("Linf", "L2", None)

#: ``build(model, eps, *, num_classes, seed, band, options) -> Attack``; ``options`` are the
#: entry's defaults updated with the spec's options.
Builder = Callable[..., Attack]


def _parse_eps(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"expected a number or a fraction such as '8/255', got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(Fraction(value.strip()))
        except (ValueError, ZeroDivisionError):
            pass
    raise ValueError(f"expected a number or a fraction such as '8/255', got {value!r}")


@dataclass
class AttackSpec:
    """One attack of a robustness evaluation: a registered name, a list of budgets, options.

    Args:
        name: a key of :data:`ATTACKS` (``"pgd"``, ``"autoattack"``, ...).
        eps: the budgets to evaluate, each giving one point of the accuracy-vs-eps curve;
            numbers, or fractions written as strings (``"8/255"``, handy in YAML). Include 0 to
            run the eps = 0 sanity check.
        band: the frequency band of a ``band_*`` attack: a radial band (a name in
            :data:`~lightning_bandlimit.recipes.frequency_band.BANDS` or ``[low, high]``,
            default ``"high"``), or a band defined by a model's input layer: ``"dropped"`` (what
            it ignores) or ``"kept"`` (its box), see :mod:`~lightning_bandlimit.recipes.input_band`;
            must be ``None`` for the other attacks.
        options: constructor arguments overriding the entry's full-strength defaults (e.g.
            ``{"steps": 20}``); the accepted names are the keys of the entry's ``defaults``.
        label: the name used in the report (default: ``name``, plus the band for band attacks);
            labels must be unique within an evaluation.
        band_of: for ``band: dropped | kept``, the evaluated model (or variant) whose input layer
            defines the band, applied to every model so that all face the same perturbations;
            default: the one band-limited model of the evaluation.

    Raises:
        ValueError: if an ``eps`` is neither a number nor a fraction string.

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
        banded = self.name in _REGISTRY and _REGISTRY[self.name].banded
        if self.band is None and not banded:
            return self.name
        if self.band is None or isinstance(self.band, str):
            band = self.band or "high"
            if self.band_of and band in MODEL_BANDS:
                band = f"{band}@{self.band_of}"
        else:
            band = "-".join(f"{float(b):g}" for b in self.band)
        return f"{self.name}[{band}]"


@dataclass(frozen=True)
class AttackInfo:
    """A registered attack: how to build it and what its results mean.

    Args:
        name: the registry key.
        build: ``build(model, eps, *, num_classes, seed, band, options) -> torchattacks.Attack``.
        norm: ``"Linf"``, ``"L2"`` or ``None`` (random noise), the default threat norm.
        threat: :data:`THREAT_FULL`, :data:`THREAT_BAND` or :data:`THREAT_NOISE`.
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
    threat: str
    iterative: bool
    eps_meaning: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    banded: bool = False
    minimum_norm: bool = False

    def __post_init__(self) -> None:
        if self.norm not in _NORMS or self.threat not in _THREATS:
            raise ValueError(
                f"expected norm in {_NORMS} and threat in {_THREATS}, got {self.norm!r} and {self.threat!r}"
            )

    def resolve_norm(self, options: Mapping[str, Any]) -> str | None:
        """The norm of a run: the ``norm`` option where the attack takes one, else :attr:`norm`."""
        return options.get("norm", self.norm) if "norm" in self.defaults else self.norm


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


# --------------------------------------------------------------------------------------------
# builders


def _alpha(eps: float, options: Mapping[str, Any]) -> float:
    alpha = options.get("alpha")
    return 2.5 * eps / options["steps"] if alpha is None else float(alpha)


class _PGDL2(torchattacks.PGDL2):
    """torchattacks' PGD-L2, except at ``eps = 0``: there its projection computes ``0 / 0`` and
    returns NaN images, so the zero-radius ball's only point (the clean image) is returned."""

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.eps == 0:
            return images.clone().detach().to(self.device)
        return super().forward(images, labels)


class CWMinNorm(Attack):
    """Minimum-norm Carlini-Wagner L2: torchattacks' ``CW`` at several ``c``, smallest L2 kept.

    For each constant in ``c`` it runs ``torchattacks.CW`` and keeps, per sample, the
    misclassified example of smallest L2 distance (the clean image where none was found), a
    grid stand-in for the original binary search over ``c``. See the module docstring for how
    a minimum-norm result is evaluated at a budget.

    Args:
        model: the model (images in ``[0, 1]``, logits out).
        c: one constant or a sequence of them (all positive).
        kappa: confidence margin.
        steps: Adam steps per constant.
        lr: Adam learning rate (in tanh space).

    Raises:
        ValueError: for a non-positive constant, steps or learning rate.

    Example:
        >>> model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3)).eval()
        >>> attack = CWMinNorm(model, c=[1.0, 10.0], steps=5)
        >>> attack(torch.rand(2, 3, 2, 2), torch.tensor([0, 1])).shape
        torch.Size([2, 3, 2, 2])
    """

    def __init__(
        self,
        model: nn.Module,
        c: float | Sequence[float] = (0.1, 1.0, 10.0),
        kappa: float = 0.0,
        steps: int = 100,
        lr: float = 0.01,
    ) -> None:
        super().__init__("CWMinNorm", model)
        constants = [float(c)] if isinstance(c, (int, float)) else [float(v) for v in c]
        if not constants or min(constants) <= 0 or int(steps) < 1 or lr <= 0:
            raise ValueError(
                f"expected positive constants c, steps >= 1 and lr > 0, got c={c!r}, steps={steps}, lr={lr}"
            )
        self.c, self.kappa, self.steps, self.lr = tuple(constants), float(kappa), int(steps), float(lr)
        self.supported_mode = ["default"]

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        images = images.clone().detach().to(self.device)
        labels = labels.clone().detach().to(self.device)
        best = images.clone()
        best_l2 = torch.full((len(images),), math.inf, device=images.device)
        for constant in self.c:
            inner = torchattacks.CW(self.model, c=constant, kappa=self.kappa, steps=self.steps, lr=self.lr)
            adv = inner(images, labels)
            with torch.no_grad():
                fooled = self.get_logits(adv).argmax(1) != labels
                l2 = (adv - images).flatten(1).norm(dim=1)
                better = fooled & (l2 < best_l2)
                best[better] = adv[better]
                best_l2[better] = l2[better]
        return best


def _build_fgsm(model: nn.Module, eps: float, **_: Any) -> Attack:
    return torchattacks.FGSM(model, eps=eps)


def _build_pgd(model: nn.Module, eps: float, *, options: Mapping[str, Any], **_: Any) -> Attack:
    return torchattacks.PGD(
        model,
        eps=eps,
        alpha=_alpha(eps, options),
        steps=int(options["steps"]),
        random_start=bool(options["random_start"]),
    )


def _build_pgd_l2(model: nn.Module, eps: float, *, options: Mapping[str, Any], **_: Any) -> Attack:
    return _PGDL2(
        model,
        eps=eps,
        alpha=_alpha(eps, options),
        steps=int(options["steps"]),
        random_start=bool(options["random_start"]),
        eps_for_division=float(options["eps_for_division"]),
    )


def _build_cw(model: nn.Module, eps: float, *, options: Mapping[str, Any], **_: Any) -> Attack:
    return CWMinNorm(model, c=options["c"], kappa=options["kappa"], steps=options["steps"], lr=options["lr"])


def _build_autoattack(
    model: nn.Module, eps: float, *, num_classes: int, seed: int, options: Mapping[str, Any], **_: Any
) -> Attack:
    attack = torchattacks.AutoAttack(
        model,
        norm=options["norm"],
        eps=eps,
        version=options["version"],
        n_classes=num_classes,
        seed=seed,
    )
    steps, queries = int(options["steps"]), int(options["n_queries"])
    targets = options["n_target_classes"]
    targets = num_classes - 1 if targets is None else int(targets)
    if steps < 1 or queries < 1 or not 1 <= targets <= num_classes - 1:
        raise ValueError(
            f"autoattack expects steps >= 1, n_queries >= 1 and 1 <= n_target_classes <= {num_classes - 1}, "
            f"got {steps}, {queries} and {targets}"
        )
    for inner in attack._autoattack.attacks:
        inner.seed = seed
        if isinstance(inner, (torchattacks.APGD, torchattacks.APGDT, torchattacks.FAB)):
            inner.steps = steps  # the reference implementation's 100 (torchattacks: 10)
        if isinstance(inner, (torchattacks.APGDT, torchattacks.FAB)):
            inner.n_target_classes = targets
        if isinstance(inner, torchattacks.Square):
            inner.n_queries = queries
    return attack


def _build_gaussian_noise(model: nn.Module, eps: float, **_: Any) -> Attack:
    return torchattacks.GN(model, std=eps)


def _build_band_pgd(norm: str) -> Builder:
    def build(
        model: nn.Module, eps: float, *, band: tuple[float, float], options: Mapping[str, Any], **_: Any
    ) -> Attack:
        from lightning_bandlimit.recipes.band_attacks import BandPGD

        alpha = _alpha(eps, options)
        if eps == 0 and alpha == 0:
            alpha = 1.0  # BandPGD requires alpha > 0; at eps = 0 it returns the images unchanged
        return BandPGD(
            model,
            eps=eps,
            alpha=alpha,
            steps=int(options["steps"]),
            band=band,
            norm=norm,
            random_start=bool(options["random_start"]),
            projection_rounds=int(options["projection_rounds"]),
        )

    return build


def _build_band_noise(
    model: nn.Module,
    eps: float,
    *,
    seed: int,
    band: tuple[float, float],
    options: Mapping[str, Any],
    **_: Any,
) -> Attack:
    from lightning_bandlimit.recipes.band_attacks import BandNoise

    return BandNoise(
        model, eps=eps, band=band, norm=options["norm"], distribution=options["distribution"], seed=seed
    )


_PGD_DEFAULTS = {"steps": 50, "alpha": None, "random_start": True}
_BAND_PGD_DEFAULTS = {**_PGD_DEFAULTS, "projection_rounds": 10}

#: The registry: attack name -> :class:`AttackInfo` (read-only; see :func:`register_attack`).
_REGISTRY: dict[str, AttackInfo] = {}
ATTACKS: Mapping[str, AttackInfo] = MappingProxyType(_REGISTRY)


def register_attack(info: AttackInfo, *, replace: bool = False) -> AttackInfo:
    """Add an attack to :data:`ATTACKS` (for custom attacks; the built-ins are registered here).

    Args:
        info: the attack's entry.
        replace: allow replacing an entry of the same name.

    Returns:
        ``info``.

    Raises:
        ValueError: if the name is taken and ``replace`` is false.

    Example:
        >>> info = AttackInfo("fgsm_copy", ATTACKS["fgsm"].build, "Linf", THREAT_FULL, False, "L-inf step")
        >>> register_attack(info).name in ATTACKS
        True
        >>> _ = _REGISTRY.pop("fgsm_copy")
    """
    if info.name in _REGISTRY and not replace:
        raise ValueError(
            f"an attack named {info.name!r} is registered already; pass replace=True to replace it"
        )
    _REGISTRY[info.name] = info
    return info


for _info in (
    AttackInfo(
        "fgsm", _build_fgsm, "Linf", THREAT_FULL, False, "L-inf step size (= radius), one gradient-sign step"
    ),
    AttackInfo("pgd", _build_pgd, "Linf", THREAT_FULL, True, "L-inf radius", _PGD_DEFAULTS),
    AttackInfo(
        "pgd_l2",
        _build_pgd_l2,
        "L2",
        THREAT_FULL,
        True,
        "L2 radius over all pixels and channels",
        {**_PGD_DEFAULTS, "eps_for_division": 1e-10},
    ),
    AttackInfo(
        "cw",
        _build_cw,
        "L2",
        THREAT_FULL,
        True,
        "L2 budget: a minimum-norm example counts only if its L2 norm is at most eps",
        {"c": (0.1, 1.0, 10.0), "kappa": 0.0, "steps": 100, "lr": 0.01},
        minimum_norm=True,
    ),
    AttackInfo(
        "autoattack",
        _build_autoattack,
        "Linf",
        THREAT_FULL,
        True,
        "radius in the norm option (L-inf by default)",
        {"norm": "Linf", "version": "standard", "steps": 100, "n_queries": 5000, "n_target_classes": None},
    ),
    AttackInfo(
        "gaussian_noise", _build_gaussian_noise, None, THREAT_NOISE, False, "standard deviation of the noise"
    ),
    AttackInfo(
        "band_pgd",
        _build_band_pgd("Linf"),
        "Linf",
        THREAT_BAND,
        True,
        "L-inf radius of a perturbation restricted to the band",
        _BAND_PGD_DEFAULTS,
        banded=True,
    ),
    AttackInfo(
        "band_pgd_l2",
        _build_band_pgd("L2"),
        "L2",
        THREAT_BAND,
        True,
        "L2 radius of a perturbation restricted to the band",
        _BAND_PGD_DEFAULTS,
        banded=True,
    ),
    AttackInfo(
        "band_noise",
        _build_band_noise,
        "Linf",
        THREAT_NOISE,
        False,
        "amplitude of random noise restricted to the band, in the norm option (L-inf by default)",
        {"norm": "Linf", "distribution": "gaussian"},
        banded=True,
    ),
):
    register_attack(_info)


def attack_names() -> list[str]:
    """The registered attack names, sorted.

    Example:
        >>> attack_names()[:3]
        ['autoattack', 'band_noise', 'band_pgd']
    """
    return sorted(_REGISTRY)


def _band_of(spec: AttackSpec, info: AttackInfo) -> tuple[float, float] | None:
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
    return _band_of(spec, _info(spec))


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
    if spec.name not in _REGISTRY:
        raise ValueError(f"unknown attack {spec.name!r}; expected one of: {', '.join(attack_names())}")
    return _REGISTRY[spec.name]


def validate_attack_specs(specs: Sequence[AttackSpec | Mapping[str, Any]]) -> list[AttackSpec]:
    """Check attack specifications before any work; mappings are turned into :class:`AttackSpec`.

    Args:
        specs: the attacks of an evaluation (at least one).

    Returns:
        The specifications as :class:`AttackSpec` objects, in order.

    Raises:
        ValueError: for no attacks, an unknown name (the message lists the valid ones), an
            empty, negative, non-finite or repeated ``eps`` (or an L-inf ``eps`` above 1), a band
            on an attack without one or an invalid band, an unknown option (the message lists
            the accepted ones), or two attacks with the same label.

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
            spec = AttackSpec(**spec)
        if not isinstance(spec, AttackSpec):
            raise ValueError(f"expected an AttackSpec or a mapping of its fields, got {spec!r}")
        if spec.name not in _REGISTRY:
            raise ValueError(f"unknown attack {spec.name!r}; expected one of: {', '.join(attack_names())}")
        info = _REGISTRY[spec.name]
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
                _band_of(spec, info)
            except ValueError as error:  # name the model bands too
                raise ValueError(f"{error}; or a model's band: {', '.join(MODEL_BANDS)}") from None
        elif spec.band is not None:
            raise ValueError(
                f"attack {spec.name!r} takes no band (band attacks: "
                f"{', '.join(n for n in attack_names() if _REGISTRY[n].banded)}), got band={spec.band!r}"
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
            :class:`~lightning_bandlimit.recipes.input_band.InputBand`.

    Raises:
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
    band: tuple[float, float] | BandSubspace | None = _band_of(spec, info)
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
