"""The robustness recipe's record types: one evaluated point, and one worst case per budget.

They hold plain values only (no tensors, no models), so reports, sanity checks and the study
read them without importing the evaluation code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightning_bandlimit.recipes.threats.attack_info import THREAT_FULL

__all__ = ["RobustnessRecord", "WorstCaseRecord"]


@dataclass
class RobustnessRecord:
    """One evaluated point: a model under one attack at one budget (and band).

    Args:
        model: the model's name.
        attack: the attack's label (see :attr:`AttackSpec.key`).
        attack_name: the registered attack name.
        threat: ``"full-spectrum white-box"``, ``"band-restricted white-box"`` or ``"random noise"``.
        norm: ``"Linf"``, ``"L2"`` or ``None``.
        eps: the budget (meaning per attack, see :mod:`~lightning_bandlimit.recipes.threats`).
        band: ``[low, high]`` normalised radial band of band attacks, else ``None``.
        band_name: the band's name when given by name.
        iterative: whether accuracy must be non-increasing in ``eps``.
        n: samples evaluated.
        clean_correct: samples classified correctly without attack.
        robust_correct: samples classified correctly under the attack.
        flipped: samples whose correctness differs from the clean pass.
        clean_accuracy: ``clean_correct / n`` (in float64).
        robust_accuracy: ``robust_correct / n`` (in float64).
        mean_l2: mean L2 norm of the perturbations, over all samples.
        mean_linf: mean L-inf norm of the perturbations, over all samples.
        max_l2: largest L2 norm.
        max_linf: largest L-inf norm.
        seconds: wall time of the run that produced it (a minimum-norm attack's single run is
            shared by all its budgets).
        seed: the run's seed.
        variant: the variant the model is a replicate of (default: the model's name).
        replicate: the replicate's index within its variant (e.g. its training seed's index).
        band_source: for a model's band (``band_name`` ``"dropped"`` / ``"kept"``), the variant
            whose input layer defines it.
    """

    model: str
    attack: str
    attack_name: str
    threat: str
    norm: str | None
    eps: float
    band: list[float] | None
    band_name: str | None
    iterative: bool
    n: int
    clean_correct: int
    robust_correct: int
    flipped: int
    clean_accuracy: float
    robust_accuracy: float
    mean_l2: float
    mean_linf: float
    max_l2: float
    max_linf: float
    seconds: float
    seed: int
    variant: str = ""
    replicate: int = 0
    band_source: str | None = None

    def __post_init__(self) -> None:
        self.variant = self.variant or self.model

    @classmethod
    def fabricate(cls, model: str, attack: str, eps: float, **values: Any) -> RobustnessRecord:
        """A record with made-up but consistent values (for tests and examples).

        Args:
            model: model name.
            attack: attack label (also its name, unless given).
            eps: budget.
            **values: fields to set; the rest default to an iterative full-spectrum L-inf
                attack on 10 samples, all correct, with perturbations exactly at ``eps``.

        Example:
            >>> RobustnessRecord.fabricate("m", "pgd", 0.1, robust_correct=3).robust_accuracy
            0.3
        """
        n = values.get("n", 10)
        clean = values.get("clean_correct", n)
        robust = values.get("robust_correct", clean)
        record = {
            "model": model,
            "attack": attack,
            "attack_name": attack,
            "threat": THREAT_FULL,
            "norm": "Linf",
            "eps": float(eps),
            "band": None,
            "band_name": None,
            "iterative": True,
            "n": n,
            "clean_correct": clean,
            "robust_correct": robust,
            "flipped": abs(clean - robust),
            "clean_accuracy": clean / n,
            "robust_accuracy": robust / n,
            "mean_l2": float(eps),
            "mean_linf": float(eps),
            "max_l2": float(eps),
            "max_linf": float(eps),
            "seconds": 0.0,
            "seed": 0,
        }
        record.update(values)
        return cls(**record)


@dataclass
class WorstCaseRecord:
    """Per-sample worst case over several attacks sharing a threat, norm and budget.

    A sample counts as robust only if it is classified correctly on the clean image *and*
    under every listed attack (the clean image is inside every budget).

    Args:
        model: the model's name.
        threat: :data:`THREAT_FULL` (the robust accuracy) or :data:`THREAT_BAND`.
        norm: ``"Linf"`` or ``"L2"``.
        eps: the budget.
        band: the band of band-restricted attacks, else ``None``.
        attacks: the attack labels combined.
        n: samples.
        clean_accuracy: accuracy without attack.
        robust_correct: samples robust to all listed attacks.
        robust_accuracy: ``robust_correct / n``.
        variant: the variant the model is a replicate of (default: the model's name).
        replicate: the replicate's index within its variant.
        band_name: the band's name (``"dropped"`` / ``"kept"`` for a model's band).
        band_source: the variant whose input layer defines a model's band.
    """

    model: str
    threat: str
    norm: str
    eps: float
    band: list[float] | None
    attacks: list[str]
    n: int
    clean_accuracy: float
    robust_correct: int
    robust_accuracy: float
    variant: str = ""
    replicate: int = 0
    band_name: str | None = None
    band_source: str | None = None

    def __post_init__(self) -> None:
        self.variant = self.variant or self.model
