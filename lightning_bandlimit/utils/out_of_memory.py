"""The package's one test of an out-of-memory error, for every room that catches one.

The out-of-memory backstop (:mod:`lightning_bandlimit.callbacks.out_of_memory`) retries a step on
it; the micro-batch split trial (:mod:`lightning_bandlimit.microbatch.trial`) reports it as the
reason a split could not be tried. It needs torch and Lightning (their errors), unlike the rest
of :mod:`lightning_bandlimit.utils`; nothing else here imports them.
"""

from __future__ import annotations

import torch
from lightning.pytorch.utilities.memory import is_oom_error

__all__ = ["is_out_of_memory"]


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says a device or the host ran out of memory.

    Example:
        >>> is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
        True
        >>> is_out_of_memory(MemoryError()), is_out_of_memory(ValueError("bad shape"))
        (True, False)
    """
    if is_oom_error(error):
        return True
    # Lightning's test wants a one-argument RuntimeError naming CUDA or DefaultCPUAllocator; this
    # also catches host MemoryError, a CUDA OOM error raised with other arguments, other devices'
    # "out of memory" (MPS, XPU) and allocators' "can't allocate memory".
    if isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)
