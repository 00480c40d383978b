"""The micro-batch split tried before the ladder uses it: its gradient against the whole batch's.

:class:`~.step.SplitStep` gives the whole batch's gradient only for a loss that is a mean over
the batch's samples, computed sample by sample: a loss summed over samples, in-batch negatives
(a contrastive loss over the batch's pairs) or a ``training_step`` that needs the whole batch
train on another gradient, silently. :func:`split_trial` runs the module's own
``training_step`` on a real batch, whole and in chunks (each chunk's loss weighted by its share
of the batch, as the split step weights it), and compares the two gradients (relative L2
difference) against what round-off allows at the job's precision.

The judgement runs twice. In eval mode (BatchNorm on its running statistics, dropout off) it
finds what the user's ``training_step`` does wrong for a split (a summed loss, in-batch
negatives): then the split is refused. In training mode (BatchNorm on each chunk's own
statistics, dropout still off: its masks are random, not batch-dependent) it finds what the
split changes as the model trains: BatchNorm's ghost batches. A split whose training-mode
gradient is the whole batch's to round-off is exact (:attr:`SplitTrial.exact_in_training`); one
that differs only there is a ghost-batch split (:attr:`SplitTrial.ghost`), approximate, which the
caller may allow for large enough chunks (``AdaptiveBandLimit(ghost_batch=...)``). The
trial leaves the run as it was: the random streams, the parameters and their ``.grad``, the
BatchNorm statistics, the torchmetrics states, the modules' ``training`` flags; ``self.log``
logs nothing during it. What the user's model does wrong is returned as a reason, never raised.
"""

from __future__ import annotations

import contextlib
import gc
import math
import random
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torchmetrics import Metric

from lightning_bandlimit.microbatch._torchmetrics import metric_state, restore_metric_state
from lightning_bandlimit.microbatch.chunks import batch_size, split_batch
from lightning_bandlimit.microbatch.step import step_loss
from lightning_bandlimit.recompute.running_stats import running_stats_kept
from lightning_bandlimit.recompute.trial import float32_eps
from lightning_bandlimit.utils.out_of_memory import is_out_of_memory

__all__ = ["SplitTrial", "split_trial"]

_SEED = 20231  # both passes start from the same random numbers
_FLOAT64_TOLERANCE = 1e-9
_FLOAT32_TOLERANCE = 1e-4
_HALF_TOLERANCE = 3e-2  # 16-bit parameters or autocast to a 16-bit type
_SUMMED_SLACK = 0.1  # a summed loss: the gradients' norm ratio within 10 % of what a sum gives
_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class SplitTrial:
    """What :func:`split_trial` found.

    Attributes:
        difference: ``||g_split - g_whole|| / ||g_whole||`` in eval mode (``nan``: not run).
        tolerance: the largest difference round-off allows at the parameters' dtype and the
            step's precision.
        batch_norm_difference: the same with the BatchNorm layers in train mode (on each
            chunk's statistics; the rest in eval mode, dropout off), when the module has
            BatchNorm layers in training mode; else ``None``.
        reason: why the split is refused; ``None``: it is exact in eval mode.

    Example:
        >>> exact = SplitTrial(difference=1e-16, tolerance=1e-9, batch_norm_difference=None, reason=None)
        >>> exact.exact, exact.ghost, exact.exact_in_training
        (True, False, True)
        >>> ghost = SplitTrial(difference=1e-16, tolerance=1e-9, batch_norm_difference=0.7, reason=None)
        >>> ghost.exact, ghost.ghost, ghost.exact_in_training
        (True, True, False)
    """

    difference: float
    tolerance: float
    batch_norm_difference: float | None
    reason: str | None

    @property
    def exact(self) -> bool:
        """Whether the split gives the whole batch's gradient (to round-off) in eval mode: the
        user's ``training_step`` allows a split at all."""
        return self.reason is None

    @property
    def ghost(self) -> bool:
        """Whether the split is exact in eval mode but not in training mode: BatchNorm normalises
        each chunk by its own statistics (ghost batches), an approximation of the whole batch's
        gradient (a difference that is not finite counts as one)."""
        return (
            self.exact
            and self.batch_norm_difference is not None
            and not (self.batch_norm_difference <= self.tolerance)
        )

    @property
    def exact_in_training(self) -> bool:
        """Whether the split gives the whole batch's gradient as the model trains (training
        mode, dropout held fixed): exact, not a ghost-batch split."""
        return self.exact and not self.ghost


def split_trial(
    pl_module: nn.Module,
    batch: Any,
    batch_idx: int,
    split: int = 2,
    context: Callable[[], AbstractContextManager[Any]] | None = None,
) -> SplitTrial:
    """Whether ``batch`` in ``split`` chunks gives ``pl_module``'s whole-batch gradient.

    Runs ``pl_module.training_step`` (the module's own, not the strategy's: no DDP communication)
    on the whole batch and on its chunks (:func:`~.chunks.split_batch`), each chunk's loss weighted
    by its share of the batch, and compares the gradients of the parameters that require grad
    (:func:`torch.autograd.grad`: no ``.grad`` is touched). The judgement runs in eval mode; with
    BatchNorm layers in training mode a second comparison, in train mode, gives
    :attr:`SplitTrial.batch_norm_difference` and whether the split is exact as the model trains
    (:attr:`SplitTrial.exact_in_training`) or a ghost-batch split (:attr:`SplitTrial.ghost`).
    Nothing of the run is changed (see the module docstring); whatever the user's
    ``training_step`` raises becomes the :attr:`SplitTrial.reason`.

    Args:
        pl_module: the LightningModule (any module with a ``training_step``).
        batch: a real training batch (a collection of tensors, as :func:`~.chunks.split_batch`
            takes); it is not changed.
        batch_idx: the batch's index, passed to ``training_step``.
        split: the number of chunks to try (at least 2).
        context: a factory of the context both passes run in (the precision's
            ``trainer.precision_plugin.train_step_context``: autocast under ``bf16-mixed``);
            ``None``: none.

    Returns:
        A :class:`SplitTrial`: :attr:`SplitTrial.exact` says whether the split may be used at all,
        :attr:`SplitTrial.exact_in_training` whether it is exact as the model trains.

    Raises:
        TypeError: for a ``pl_module`` that is not a module with a ``training_step``.
        ValueError: for a ``split`` that is not an int of at least 2.

    Example:
        >>> import lightning.pytorch as pl
        >>> class Net(pl.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.lin = nn.Linear(3, 2)
        ...     def training_step(self, batch, batch_idx):
        ...         x, y = batch
        ...         return nn.functional.cross_entropy(self.lin(x), y)
        >>> batch = (torch.randn(8, 3, dtype=torch.float64), torch.randint(0, 2, (8,)))
        >>> result = split_trial(Net().double(), batch, 0, split=2)
        >>> result.exact, result.difference < 1e-12, result.tolerance
        (True, True, 1e-09)
    """
    if not isinstance(pl_module, nn.Module) or not callable(getattr(pl_module, "training_step", None)):
        raise TypeError(
            "pl_module must be a LightningModule (a module with a training_step), "
            f"got {type(pl_module).__name__}"
        )
    if isinstance(split, bool) or not isinstance(split, int) or split < 2:
        raise ValueError(f"split must be an int >= 2, got {split!r}")
    params = [p for p in pl_module.parameters() if p.requires_grad]
    device = params[0].device if params else torch.device("cpu")
    tolerance = _HALF_TOLERANCE
    out_of_memory = False
    try:
        tolerance = _tolerance(params, device, context)
        result = _trial(pl_module, batch, batch_idx, split, context, params, tolerance)
    except Exception as error:
        out_of_memory = is_out_of_memory(error)
        what = "out of memory" if out_of_memory else f"{type(error).__name__}: {_first_line(error)}"
        result = SplitTrial(math.nan, tolerance, None, f"the split could not be tried: {what}")
    if out_of_memory:  # the error and its frames are gone here: their tensors can be freed
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return result


def _tolerance(
    params: list[nn.Parameter],
    device: torch.device,
    context: Callable[[], AbstractContextManager[Any]] | None,
) -> float:
    dtypes = {p.dtype for p in params if p.is_floating_point()}
    with context() if context is not None else contextlib.nullcontext():
        autocast = torch.is_autocast_enabled(device.type) and torch.get_autocast_dtype(device.type) in _HALF
    if autocast or dtypes & set(_HALF):
        return _HALF_TOLERANCE
    if dtypes and dtypes <= {torch.float64}:
        return _FLOAT64_TOLERANCE
    return max(_FLOAT32_TOLERANCE, 10 * float32_eps(device, torch.float32))


def _trial(
    module: nn.Module,
    batch: Any,
    batch_idx: int,
    split: int,
    context: Callable[[], AbstractContextManager[Any]] | None,
    params: list[nn.Parameter],
    tolerance: float,
) -> SplitTrial:
    size = batch_size(batch)
    if size is None:
        return SplitTrial(math.nan, tolerance, None, "the batch has no tensor with a sample dimension")
    if size < 2:
        return SplitTrial(math.nan, tolerance, None, f"a batch of {size} sample(s) cannot be split")
    if not params:
        return SplitTrial(math.nan, tolerance, None, "the module has no parameter that requires grad")
    modules = list(module.modules())
    batch_norms = [m for m in modules if isinstance(m, _BatchNorm) and m.training]
    run = _Passes(module, batch, batch_idx, split, context, params)
    # the caller may be under no_grad or inference_mode (its batch then of inference tensors)
    with torch.inference_mode(False), torch.enable_grad(), _untouched(module, params[0].device):
        for m in modules:  # eval mode: BatchNorm on its running statistics, dropout off
            m.training = False
        compared = run.compare()
        if isinstance(compared, str):
            return SplitTrial(math.nan, tolerance, None, compared)
        difference, ratio, expected = compared
        reason = _judge(difference, ratio, expected, tolerance, split)
        batch_norm_difference = None
        if batch_norms:  # train mode for the BatchNorm layers only: each chunk on its own statistics
            for m in batch_norms:
                m.training = True
            with running_stats_kept(batch_norms):
                in_train = run.compare()
            batch_norm_difference = in_train[0] if not isinstance(in_train, str) else math.nan
    return SplitTrial(difference, tolerance, batch_norm_difference, reason)


def _judge(difference: float, ratio: float, expected: float, tolerance: float, split: int) -> str | None:
    if difference <= tolerance:
        return None
    if math.isinf(difference):
        return "the whole batch's gradient is zero, the split's is not"
    if math.isnan(difference):
        return "the gradients are not finite"
    if abs(ratio / expected - 1) <= _SUMMED_SLACK:
        return (
            f"the whole batch's gradient is {ratio:.3g} times the split's at split {split} "
            f"({expected:.3g} for a loss summed over samples): the loss looks summed over samples, "
            "not averaged; the split needs a mean over the batch's samples"
        )
    return (
        f"the split's gradient differs from the whole batch's by {difference:.3g} (relative; round-off "
        f"allows {tolerance:.3g}): a loss that is not a mean over samples, in-batch negatives, or a "
        "training_step that needs the whole batch"
    )


class _Passes:
    """The whole batch's and the chunks' gradients, compared."""

    def __init__(
        self,
        module: nn.Module,
        batch: Any,
        batch_idx: int,
        split: int,
        context: Callable[[], AbstractContextManager[Any]] | None,
        params: list[nn.Parameter],
    ) -> None:
        self.module, self.batch, self.split, self.params = module, batch, split, params
        self.context = context or contextlib.nullcontext
        step = module.training_step  # type: ignore[operator]
        self.args = (batch_idx,) if is_param_in_hook_signature(step, "batch_idx", min_args=2) else ()

    def compare(self) -> tuple[float, float, float] | str:
        """``(difference, ||g_whole|| / ||g_split||, that ratio for a summed loss)``, or why
        there is nothing to compare.

        The chunks' gradient first, then the whole batch's subtracted from it in place: the
        trial runs when memory is short, and holds two gradients of the model, not four.
        """
        parts = split_batch(_copied(self.batch), self.split)
        size = sum(count for _, count in parts)
        weights = [count / size for _, count in parts]
        chunks = self.gradient([(part, weight) for (part, _), weight in zip(parts, weights)])
        if isinstance(chunks, int):
            if self.no_loss_for_the_whole_batch():
                return "training_step returned no loss for the whole batch"
            return f"training_step returned no loss for chunk {chunks + 1} of {len(parts)}"
        split_norm = _norm(chunks)
        whole = self.gradient([(_copied(self.batch), 1.0)])
        if isinstance(whole, int):
            return "training_step returned no loss for the whole batch"
        whole_norm = _norm(whole)
        for chunk, part in zip(chunks, whole):
            chunk.sub_(part)
        del whole
        error = _norm(chunks)
        if whole_norm == 0:
            difference = 0.0 if split_norm == 0 else math.inf
        else:
            difference = error / whole_norm
        ratio = whole_norm / split_norm if split_norm else math.inf
        # a summed loss: each chunk's gradient shrinks by its weight
        expected = 1 / sum(w * w for w in weights)
        return difference, ratio, expected

    def no_loss_for_the_whole_batch(self) -> bool:
        """Whether ``training_step`` returns no loss for the whole batch (a forward, no graph)."""
        with torch.no_grad(), self.context():
            return step_loss(self.module.training_step(_copied(self.batch), *self.args)) is None  # type: ignore[operator]

    def gradient(self, pieces: list[tuple[Any, float]]) -> list[torch.Tensor] | int:
        """The gradient of the pieces' weighted losses (summed chunk by chunk, in place: one
        chunk's graph and gradient at a time), or the index of the piece whose ``training_step``
        returned no loss."""
        total: list[torch.Tensor] | None = None
        _seed(self.params[0].device)
        for index, (piece, weight) in enumerate(pieces):
            with self.context():
                loss = step_loss(self.module.training_step(piece, *self.args))  # type: ignore[operator]
            if loss is None:
                return index
            if not loss.requires_grad:
                raise ValueError("training_step's loss does not require grad")
            grads = torch.autograd.grad(loss * weight, self.params, allow_unused=True)
            del loss
            grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, self.params)]
            if total is None:
                total = grads
            else:
                for t, g in zip(total, grads):
                    t.add_(g)
                del grads
        assert total is not None
        return total


def _norm(tensors: Iterable[torch.Tensor]) -> float:
    squares = sum(torch.linalg.vector_norm(t, dtype=torch.float64).square() for t in tensors)
    return math.sqrt(float(squares))


def _copied(batch: Any) -> Any:
    """The batch's tensors copied: a ``training_step`` that changes its batch in place leaves the
    real one as it was."""
    return apply_to_collection(batch, torch.Tensor, lambda t: t.clone())


def _seed(device: torch.device) -> None:
    torch.default_generator.manual_seed(_SEED)
    if device.type == "cuda":
        torch.cuda.default_generators[device.index or 0].manual_seed(_SEED)


@contextlib.contextmanager
def _untouched(module: nn.Module, device: torch.device) -> Iterator[None]:
    """The run as it was after the block: random streams, ``training`` flags, torchmetrics states;
    ``log``/``log_dict`` do nothing inside it."""
    flags = [(m, m.training) for m in module.modules()]
    metrics = [(m, metric_state(m)) for m in module.modules() if isinstance(m, Metric)]
    patched = {name: vars(module).get(name, _MISSING) for name in ("log", "log_dict")}
    python_state, numpy_state = random.getstate(), np.random.get_state()
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            for name in patched:
                object.__setattr__(module, name, _no_log)
            yield
    finally:
        for name, value in patched.items():
            if value is _MISSING:
                vars(module).pop(name, None)
            else:
                object.__setattr__(module, name, value)
        for m, flag in flags:
            m.training = flag
        for metric, state in metrics:
            restore_metric_state(metric, state)
        random.setstate(python_state)
        np.random.set_state(numpy_state)


_MISSING = object()


def _no_log(*args: Any, **kwargs: Any) -> None:
    """``self.log`` during the trial: nothing logged."""


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else ""
