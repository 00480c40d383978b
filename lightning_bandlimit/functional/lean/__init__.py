"""Memory-lean ops: exact gradients from the smallest exact form of what backward needs.

* :mod:`.ops` (BatchNorm, ReLU), :mod:`.pool` (max-pool) and :mod:`.conv` (the native convolution), each
  computing what its ``torch.nn.functional`` counterpart computes and keeping less for backward
  (a bit mask, the position of each maximum, the input as a recipe).
* :mod:`.sources`: the recipes themselves: an op publishes how its output can be rebuilt from
  tensors kept anyway (a band-limited convolution's kept spectrum, ``relu(affine(...))``), and
  the op that consumes the output keeps the recipe instead of the output.

The band-limited convolutions (:mod:`lightning_bandlimit.functional.fft_conv`) publish their
outputs here; the modules that use these ops are in :mod:`lightning_bandlimit.layers.lean`.
"""

from lightning_bandlimit.functional.lean.conv import lean_conv
from lightning_bandlimit.functional.lean.ops import lean_batch_norm, lean_relu, pack_mask, unpack_mask
from lightning_bandlimit.functional.lean.pool import lean_max_pool2d

__all__ = ["lean_batch_norm", "lean_conv", "lean_max_pool2d", "lean_relu", "pack_mask", "unpack_mask"]
