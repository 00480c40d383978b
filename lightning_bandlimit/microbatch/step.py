"""A training step's batch run in chunks, the optimizer stepping once: the micro-batch lever.

:class:`SplitStep` wraps the strategy's ``training_step`` (the path every Lightning strategy runs
the user's step through: the precision's autocast, DDP's forward). At split ``k`` it runs the
user's own ``training_step`` on ``k`` chunks of the batch (:func:`~.chunks.split_batch`); the
loss of each chunk but the last is back-propagated at once through ``strategy.backward`` (the
precision's loss scaling, the user's ``backward`` hook; under DDP inside ``no_sync``), weighted
by the chunk's share of the batch and divided by ``accumulate_grad_batches`` as Lightning divides
the step's loss; the last chunk's loss goes back to Lightning, which back-propagates it (DDP
synchronises the gradients there, once), clips and steps the optimizer once. What it returns has
the whole batch's loss as its value (the chunks' weighted mean) and the last chunk's gradient.

For a loss that is a mean over the batch's samples and a model without batch-dependent layers
the gradient is the whole batch's, to round-off; BatchNorm normalises each chunk by its own
statistics (ghost batches). Lightning zeroes the gradients after ``training_step`` returns, so on
the first batch of an accumulation window the gradients are zeroed before the first chunk (the
module's ``optimizer_zero_grad`` hook) and Lightning's call that step does nothing.

The user's ``on_before_backward``/``on_after_backward`` hooks run once per chunk;
``self.log`` calls of a chunk are logged with the chunk's batch size (an epoch's mean is the
batch's; a step's value is the last chunk's); torchmetrics updated per chunk equal the batch's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

from lightning_bandlimit.microbatch._lightning import logged_per_chunk
from lightning_bandlimit.microbatch.chunks import batch_size, split_batch

__all__ = ["SplitStep", "step_loss"]


def step_loss(output: Any) -> torch.Tensor | None:
    """The loss of a ``training_step``'s output (a tensor, or a mapping's ``"loss"``); ``None``
    when there is none (the step skipped)."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        loss = output.get("loss")
        return loss if isinstance(loss, torch.Tensor) else None
    return None


def _with_loss(output: Any, loss: torch.Tensor) -> Any:
    if isinstance(output, Mapping):
        return {**output, "loss": loss}
    return loss


class SplitStep:
    """Runs each training step's batch in :attr:`split` chunks (``1``: as it comes).

    Args:
        name: the name messages start with (the callback's).

    Attributes:
        split: the chunks a step's batch runs in (``1``: the step untouched).
        chunks: the chunks the last step ran in (``1``: not split).
        in_chunk: ``True`` while a chunk before the last is back-propagated (a meter that stops at
            ``on_before_backward`` waits for the last chunk's).

    Example:
        >>> step = SplitStep()
        >>> step.split, step.installed
        (1, False)
    """

    def __init__(self, name: str = "AdaptiveBandLimit") -> None:
        self.name = name
        self.split = 1
        self.min_chunk = (
            1  # the fewest samples a chunk may have (2 with BatchNorm: one sample has no variance)
        )
        self.chunks = 1
        self.in_chunk = False
        self.batch_idx = 0
        self._trainer: pl.Trainer | None = None
        self._module: pl.LightningModule | None = None
        self._zero_grad_skipped = False
        self._previous_step: Any = None
        self._previous_zero_grad: Any = None
        self._said: set[str] = set()

    @property
    def installed(self) -> bool:
        """Whether the strategy's ``training_step`` is wrapped."""
        return self._trainer is not None

    def install(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Wrap ``trainer.strategy.training_step`` (once; :meth:`remove` undoes it)."""
        if self._trainer is not None:
            return
        strategy = trainer.strategy
        original = strategy.training_step

        def training_step(*args: Any, **kwargs: Any) -> Any:
            return self._step(original, args, kwargs)

        self._previous_step = vars(strategy).get("training_step")  # another wrapper's, kept
        strategy.training_step = training_step  # type: ignore[method-assign]
        self._trainer, self._module = trainer, pl_module

    def remove(self) -> None:
        """The strategy's own ``training_step`` again; Lightning's ``zero_grad`` back."""
        self.end_step()
        if self._trainer is not None:
            _restore(self._trainer.strategy, "training_step", self._previous_step)
        self._trainer = self._module = None
        self.chunks = 1

    def start_step(self, batch_idx: int) -> None:
        """A training batch starts (its index within the epoch: where accumulation windows start)."""
        self.end_step()
        self.batch_idx = batch_idx
        self.chunks = 1

    def end_step(self) -> None:
        """A training batch ended: Lightning's ``zero_grad`` hook is the module's again."""
        if self._zero_grad_skipped and self._module is not None:
            _restore(self._module, "optimizer_zero_grad", self._previous_zero_grad)
        self._zero_grad_skipped = False

    def _say(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            rank_zero_info(f"{self.name}: {message}")

    def _unsplit_reason(self, batch: Any) -> str | None:
        module, trainer = self._module, self._trainer
        assert module is not None and trainer is not None
        if not module.automatic_optimization:
            return "manual"
        if len(trainer.optimizers) != 1:
            return "optimizers"
        size = batch_size(batch)
        if size is None or size < 2 * self.min_chunk:
            return "size"
        return None

    def _step(self, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.end_step()
        self.chunks = 1
        if self.split <= 1 or not args:
            return original(*args, **kwargs)
        batch, rest = args[0], args[1:]
        reason = self._unsplit_reason(batch)
        if reason is not None:
            self._say(reason, _UNSPLIT[reason].format(split=self.split))
            return original(*args, **kwargs)
        return self._split_step(original, batch, rest, kwargs)

    def _split_step(
        self, original: Callable[..., Any], batch: Any, rest: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        trainer, module = self._trainer, self._module
        assert trainer is not None and module is not None
        size = batch_size(batch)
        assert size is not None
        parts = split_batch(batch, min(self.split, size // self.min_chunk))
        optimizer = trainer.optimizers[0]
        accumulate = trainer.accumulate_grad_batches
        first = self.batch_idx % accumulate == 0
        if first:  # Lightning zeroes after training_step returns: here, before the first chunk
            module.optimizer_zero_grad(trainer.current_epoch, self.batch_idx, optimizer)
            self._previous_zero_grad = vars(module).get("optimizer_zero_grad")  # the user's own, kept
            module.optimizer_zero_grad = _no_zero_grad  # type: ignore[method-assign]
            self._zero_grad_skipped = True
        done: list[torch.Tensor] = []  # the chunks' weighted losses, detached
        self.chunks = len(parts)
        with logged_per_chunk(trainer) as logging_chunk:
            for index, (part, count) in enumerate(parts):
                weight = count / size
                last = index == len(parts) - 1
                logging_chunk(part)
                with contextlib.nullcontext() if last else _no_sync(trainer.strategy):
                    output = original(part, *rest, **kwargs)
                    loss = step_loss(output)
                    if loss is None:
                        return self._skipped(index, first)
                    if last:
                        value = weight * loss + sum(done) if done else weight * loss
                        return _with_loss(output, value)
                    with self._chunk():
                        trainer.strategy.backward(loss * (weight / accumulate), optimizer)
                    done.append(weight * loss.detach())
                    del output, loss
        raise AssertionError("unreachable: the last chunk returns")

    @contextlib.contextmanager
    def _chunk(self) -> Iterator[None]:
        self.in_chunk = True
        try:
            yield
        finally:
            self.in_chunk = False

    def _skipped(self, index: int, first: bool) -> None:
        """A chunk's ``training_step`` returned no loss: the step is skipped (its chunks' gradients
        dropped where the accumulation window starts with it)."""
        assert self._trainer is not None
        if first and index:
            self._trainer.optimizers[0].zero_grad(set_to_none=True)
        kept = "" if first or not index else " (the chunks before it stay in the accumulated gradient)"
        self._say(
            "none", f"training_step returned no loss for a chunk of a split batch; that step is skipped{kept}"
        )
        return None


def _restore(owner: Any, name: str, previous: Any) -> None:
    """``owner.name`` as before it was wrapped: ``previous`` (an instance attribute), else the class's."""
    if previous is None:
        vars(owner).pop(name, None)
    else:
        setattr(owner, name, previous)


def _no_zero_grad(*args: Any, **kwargs: Any) -> None:
    """Lightning's ``zero_grad`` on a split step: done already, before the first chunk."""


def _no_sync(strategy: Any) -> contextlib.AbstractContextManager[Any]:
    """The strategy's gradient synchronisation held back (DDP's ``no_sync``), where it has one."""
    block = getattr(strategy, "block_backward_sync", None)
    return block() if callable(block) else contextlib.nullcontext()


_UNSPLIT = {
    "manual": "the micro-batch split needs automatic optimization; this module's steps run whole",
    "optimizers": "the micro-batch split needs a single optimizer; steps run whole",
    "size": "a batch too small to split (or with no tensor to split) runs whole at split {split}",
}
