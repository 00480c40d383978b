"""Memory-lean ops: exact gradients from the smallest exact form of what backward needs.

* :mod:`.ops` (BatchNorm, ReLU), :mod:`.pool` (max-pool) and :mod:`.conv` (the native convolution), each
  computing what its ``torch.nn.functional`` counterpart computes and keeping less for backward
  (a bit mask, the position of each maximum, the input as a recipe).
* :mod:`.sources`: the recipes themselves: how an activation is rebuilt from tensors kept anyway
  (a band-limited convolution's kept spectrum, ``relu(affine(...))``).
* :mod:`.handoff`: an op publishes the recipe of its output, and the op that consumes the output
  looks it up and keeps the recipe instead of the output; :func:`~.handoff.quiet` tells whether
  any recipe can exist at all.
* :mod:`.shared_rebuild`: a rebuilt input shared by the two backward ops that rebuild it.
* :mod:`.regions`: what the ops save inside recomputation (a checkpointed unit, a recomputed
  region).

The band-limited convolutions (:mod:`lightning_bandlimit.functional.fft_conv`) publish their
outputs here; the modules that use these ops are in :mod:`lightning_bandlimit.layers.lean`.
"""

from lightning_bandlimit.functional.lean.conv import lean_conv
from lightning_bandlimit.functional.lean.ops import lean_batch_norm, lean_relu, pack_mask, unpack_mask
from lightning_bandlimit.functional.lean.pool import lean_max_pool2d

__all__ = ["lean_batch_norm", "lean_conv", "lean_max_pool2d", "lean_relu", "pack_mask", "unpack_mask"]
