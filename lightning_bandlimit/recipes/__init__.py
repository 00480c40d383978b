"""Recipes built on the library.

``robustness``: evaluate classifiers under adversarial and frequency-band attacks and write a
side-by-side report (``lightning-bandlimit robustness``); its parts: the attack suite, the
band-restricted threat models (:class:`BandPGD`, :class:`BandNoise`), the Fourier heat map and
the sanity checks; threat models in a model's own band (:func:`input_band`: what its input
layer keeps and drops), and several checkpoints per variant with a computed verdict
(:mod:`~lightning_bandlimit.recipes.results.study`,
:mod:`~lightning_bandlimit.recipes.results.verdict`).
"""

from lightning_bandlimit.recipes.evaluation.evaluate import RobustnessReport, evaluate_robustness
from lightning_bandlimit.recipes.evaluation.fourier_heatmap import (
    fourier_basis,
    fourier_heat_map,
    save_heat_map,
    save_heat_map_difference,
)
from lightning_bandlimit.recipes.evaluation.loading import load_classifier
from lightning_bandlimit.recipes.results.sanity import SanityCheck, SanityCheckError
from lightning_bandlimit.recipes.threats import ATTACKS, AttackSpec, build_attack
from lightning_bandlimit.recipes.threats.band_attacks import BandNoise, BandPGD
from lightning_bandlimit.recipes.threats.frequency_band import BANDS, band_mask, band_project
from lightning_bandlimit.recipes.threats.input_band import BandSubspace, InputBand, input_band

__all__ = [
    "ATTACKS",
    "BANDS",
    "AttackSpec",
    "BandNoise",
    "BandPGD",
    "BandSubspace",
    "InputBand",
    "RobustnessReport",
    "SanityCheck",
    "SanityCheckError",
    "band_mask",
    "band_project",
    "build_attack",
    "evaluate_robustness",
    "fourier_basis",
    "fourier_heat_map",
    "input_band",
    "load_classifier",
    "save_heat_map",
    "save_heat_map_difference",
]
