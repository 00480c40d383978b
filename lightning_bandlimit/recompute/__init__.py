"""Recomputation (activation checkpointing) of a model's units, exact.

Which modules are units (per-family knowledge kept as data, :mod:`.units`), plain chains split
into segments (:mod:`.segments`), switching a unit in place by subclass swap (:mod:`.switch`),
call arguments made safe to recompute (:mod:`.arguments`), BatchNorm statistics kept across a
recompute (:mod:`.running_stats`), blocks that keep only their kept spectrum (:mod:`.spectral`),
the trial that proves a unit exact before the ladder uses it (:mod:`.trial`), the bytes saved
for backward (:mod:`.saved_tensors`) and the stages the ladder's rungs checkpoint
(:mod:`.stages`).
"""
