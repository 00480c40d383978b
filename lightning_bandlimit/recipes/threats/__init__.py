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
* ``band_*``: from :mod:`lightning_bandlimit.recipes.threats.band_attacks`; ``band`` is a name
  (``"low"``, ``"mid"``, ``"high"``, ``"full"``) or a ``(low, high)`` pair of normalised radial
  frequencies (default ``"high"``).

Seeds: every attack run gets its own seed from :func:`derive_seed` (the evaluation seed, the
attack's label and ``eps``), set with ``torch.manual_seed`` on a forked RNG by the recipe and
passed to the attacks that take one, so the same seed gives identical results.

The modules: ``attack_info`` (:class:`AttackInfo`, :class:`Threat`), ``attack_builders`` (the
built-in attacks at full strength), ``attack_registry`` (:data:`ATTACKS`, populated from the
built-ins' list, and :func:`register_attack` for custom ones), ``attack_spec``
(:class:`AttackSpec`, validation, seeds, :func:`build_attack`), ``cw_attack`` (minimum-norm C&W
over a grid of constants), ``band_attacks`` (:class:`BandPGD`, :class:`BandNoise`), ``band_constraints``
(a band-limited perturbation kept exactly in the band, the eps ball and the pixel box),
``frequency_band`` (radial bands, masks, projections) and ``input_band`` (the band a model's
input layer keeps and drops). Users import the attacks' names from this package.
"""

from __future__ import annotations

from lightning_bandlimit.recipes.threats.attack_info import (
    THREAT_BAND,
    THREAT_FULL,
    THREAT_NOISE,
    AttackInfo,
    Builder,
    Threat,
)
from lightning_bandlimit.recipes.threats.attack_registry import (
    ATTACKS,
    attack_names,
    register_attack,
    registered_attack,
    unregister_attack,
)
from lightning_bandlimit.recipes.threats.attack_spec import (
    AttackSpec,
    build_attack,
    derive_seed,
    spec_band,
    spec_band_name,
    spec_model_band,
    spec_norm,
    spec_options,
    validate_attack_specs,
)
from lightning_bandlimit.recipes.threats.cw_attack import CWMinNorm

__all__ = [
    "ATTACKS",
    "THREAT_BAND",
    "THREAT_FULL",
    "THREAT_NOISE",
    "AttackInfo",
    "AttackSpec",
    "Builder",
    "CWMinNorm",
    "Threat",
    "attack_names",
    "build_attack",
    "derive_seed",
    "register_attack",
    "registered_attack",
    "spec_band",
    "spec_band_name",
    "spec_model_band",
    "spec_norm",
    "spec_options",
    "unregister_attack",
    "validate_attack_specs",
]
