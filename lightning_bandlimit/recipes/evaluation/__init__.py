"""The evaluation of the robustness recipe: from sources and attacks to records.

``plan`` (validation and resolution before any work), ``loading`` (modules and checkpoints),
``evaluation_data`` (the samples), ``evaluated_model`` (a loaded model with its variant and
band), ``attack_subspaces`` (attacks in a model's own band), ``model_runner`` (one model under
every attack), ``worst_case`` (per-sample worst case over attacks), ``fourier_heatmap`` (Yin et
al.'s Fourier heat map) and ``evaluate`` (:func:`evaluate_robustness`, the sequence over them).
Users import these names from :mod:`lightning_bandlimit.recipes.robustness`.
"""
