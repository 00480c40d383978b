"""The micro-batch lever: a training step's batch run in chunks, the global batch kept exactly.

* :mod:`.chunks`: a batch split along its sample dimension.
* :mod:`.step`: :class:`SplitStep`, the strategy's ``training_step`` run chunk by chunk, the
  optimizer stepping once.
* :mod:`.trial`: the split tried before use, its gradient against the whole batch's.
"""

from lightning_bandlimit.microbatch.chunks import batch_size, split_batch
from lightning_bandlimit.microbatch.step import SplitStep, step_loss
from lightning_bandlimit.microbatch.trial import SplitTrial, split_trial

__all__ = ["SplitStep", "SplitTrial", "batch_size", "split_batch", "split_trial", "step_loss"]
