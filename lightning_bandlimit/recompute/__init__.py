"""Recomputation (activation checkpointing) of a model's units, exact: a run-time lever, switched
on and off per unit, between steps.

The modules: which modules are units (per-family knowledge kept as data, :mod:`.units`), plain
chains split into segments (:mod:`.segments`), the units chosen for a model, by the rule or by
patterns (:mod:`.unit_choice`), switching a unit in place by subclass swap (:mod:`.switch`), its
pointwise mode (:mod:`.pointwise`), call arguments made safe to recompute (:mod:`.arguments`),
BatchNorm statistics kept across a recompute (:mod:`.running_stats`), blocks that keep only their
kept spectrum (:mod:`.spectral`), the trial that proves a unit exact before the ladder uses it
(:mod:`.trial`), the bytes saved for backward (:mod:`.saved_tensors`), one training forward
profiled unit by unit: its stages, what each unit frees and costs (:mod:`.profile`; from recorded
samples when it ran checkpointed, :mod:`.sampled_savings`), the rungs ordered by bytes freed per
second of recompute (:mod:`.plan`), and the rungs switched on a model (:mod:`.rungs`).

**What runs while a unit is checkpointed.** :func:`~lightning_bandlimit.recompute.switch.checkpoint`
changes the class of a module object to a checkpointed subclass of its own class (made once per
class), like :mod:`lightning_bandlimit.layers.surgery` swaps convolutions: the object, its
parameters, buffers, hooks, ``state_dict`` keys and any reference to it stay, and
:func:`~lightning_bandlimit.recompute.switch.uncheckpoint` is the exact inverse. While
checkpointed, a training forward with gradients runs through ``torch.utils.checkpoint.checkpoint``
in its non-reentrant mode (the one that is safe under DDP): only the module's inputs are kept for
backward, and its forward is run again in backward to rebuild what the gradients need. Gradients
are exactly those of the module without checkpointing (the same operations run on the same
values). In eval mode or without gradients the module runs its own class's forward.

**Band-limited blocks keep less than their input.** A checkpointed block whose input reaches
its arithmetic only through memory-lean band-limited convolutions, identity shortcuts and
strided 1x1 shortcuts (a ResNet basic block) keeps only what those read, the kept input
spectrum and the shortcut's stride-grid pixels, and recomputes the rest from them
(:mod:`lightning_bandlimit.recompute.spectral`; outputs and gradients equal to round-off);
other blocks, and these at a full band or on maps too small for the spectrum to be the smaller
form, fall back to the ordinary way (:func:`~lightning_bandlimit.recompute.spectral.spectral_fallback`
says why).

**BatchNorm running statistics are updated once per step.** Recomputing a module's forward
would update its BatchNorm layers' running statistics a second time (pytorch/pytorch#96136);
the recompute here restores them afterwards, so they equal those of the same model without
checkpointing.

Which modules: :func:`~lightning_bandlimit.recompute.unit_choice.checkpoint_units` finds the
block-like units of a model and the segments of its plain chains
(:mod:`lightning_bandlimit.recompute.units`: one rule, per-family knowledge as data), or takes
glob patterns over qualified names.

**Never a crash, never a wrong gradient.** Container arguments are frozen at call time
(:mod:`lightning_bandlimit.recompute.arguments`); a recompute that fails raises
:class:`~lightning_bandlimit.recompute.arguments.RecomputeMismatch` naming the unit; and
:class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` tries every unit before the ladder uses
it (:func:`~lightning_bandlimit.recompute.trial.trial`) and takes a unit that is not exact off
the ladder with one warning.
"""
