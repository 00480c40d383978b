"""The threats of the robustness recipe: what an attack is and how it is built.

``attack_info`` (:class:`AttackInfo`, :class:`Threat`), ``attack_builders`` (the built-in
attacks at full strength), ``attack_registry`` (:data:`ATTACKS`, populated from the built-ins'
list, and :func:`register_attack` for custom ones), ``attack_spec`` (:class:`AttackSpec`,
validation, seeds, :func:`build_attack`), ``cw_attack`` (minimum-norm C&W over a grid of
constants), ``band_attacks`` (:class:`BandPGD`, :class:`BandNoise`), ``frequency_band``
(radial bands, masks, projections) and ``input_band`` (the band a model's input layer keeps and
drops). Users import these names from :mod:`lightning_bandlimit.recipes.attack_suite`.
"""
