"""Recomputation (activation checkpointing) of a model's units: which modules are units (per-family
knowledge kept as data, :mod:`.units`), plain chains split into segments (:mod:`.segments`), call
arguments made safe to recompute (:mod:`.arguments`), BatchNorm statistics kept across a
recompute (:mod:`.running_stats`) and the trial that proves a unit exact before the ladder uses
it (:mod:`.trial`). The switch itself and the stages are :mod:`lightning_bandlimit.checkpointing`.
"""
