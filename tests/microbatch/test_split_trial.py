"""The split tried before use: exact for a mean loss, refused for a summed or in-batch loss, and
the run left exactly as it was."""

from __future__ import annotations

import random
import weakref
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from _helpers import cpu_trainer
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from lightning_bandlimit.microbatch import SplitTrial, split_trial
from lightning_bandlimit.utils.out_of_memory import is_out_of_memory


class Net(pl.LightningModule):
    """An MLP on ``(x, y)`` batches.

    Args:
        loss: ``"mean"`` (cross-entropy), ``"sum"`` (summed over samples), ``"negatives"`` (in-batch
            negatives: each sample's embedding against every other's in its batch), ``"zero"``
            (a loss with zero gradient), ``"none"`` (no loss), ``"none_small"`` (no loss for a
            batch of fewer than 8 samples), ``"raise"``, ``"oom"``.
        batch_norm: a BatchNorm layer after the first linear layer.
        metric: a torchmetrics accuracy updated in each step.
        log: ``self.log`` the batch's sample count (summed over the epoch).
    """

    def __init__(self, loss: str = "mean", batch_norm: bool = False, metric: bool = False, log: bool = False):
        super().__init__()
        norm = nn.BatchNorm1d(16) if batch_norm else nn.Identity()
        self.net = nn.Sequential(nn.Linear(5, 16), norm, nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, 3))
        self.loss, self.logs = loss, log
        self.acc = MulticlassAccuracy(num_classes=3) if metric else None

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        if self.loss == "raise":
            raise RuntimeError("boom in training_step")
        if self.loss == "oom":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if self.loss == "none" or (self.loss == "none_small" and len(x) < 8):
            return None
        z = self.net(x)
        if self.logs:
            self.log("samples", float(len(x)), on_step=False, on_epoch=True, reduce_fx="sum")
        if self.acc is not None:
            self.acc.update(z, y)
        if self.loss == "sum":
            return nn.functional.cross_entropy(z, y, reduction="sum")
        if self.loss == "negatives":
            return nn.functional.cross_entropy(z @ z.T, torch.arange(len(z)))
        if self.loss == "zero":
            return 0 * z.sum()
        return nn.functional.cross_entropy(z, y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _batch(n: int = 16, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 5, generator=g, dtype=torch.float64).to(dtype)
    return x, torch.randint(0, 3, (n,), generator=g)


def _net(dtype: torch.dtype = torch.float64, **kwargs: Any) -> Net:
    return Net(**kwargs).to(dtype)


@pytest.mark.parametrize("split", [2, 3, 4])
def test_a_mean_loss_is_exact_in_float64(split: int) -> None:
    result = split_trial(_net(), _batch(), 0, split=split)
    assert isinstance(result, SplitTrial) and result.exact and result.reason is None
    assert 0 <= result.difference < 1e-12 and result.tolerance == 1e-9
    assert result.batch_norm_difference is None


def test_a_mean_loss_is_exact_in_float32() -> None:
    result = split_trial(_net(torch.float32), _batch(dtype=torch.float32), 0)
    assert result.exact and result.tolerance == 1e-4 and result.difference < 1e-5


def test_under_bf16_autocast_the_tolerance_is_wider_and_the_mlp_exact() -> None:
    def bf16() -> torch.autocast:
        return torch.autocast("cpu", dtype=torch.bfloat16)

    result = split_trial(_net(torch.float32), _batch(dtype=torch.float32), 0, context=bf16)
    assert result.tolerance == 3e-2 and result.exact
    assert 0 < result.difference < 3e-2  # bf16 rounds each chunk's forward its own way


@pytest.mark.parametrize("split", [2, 3])  # 3: chunks of 6, 5 and 5
def test_a_summed_loss_is_refused_as_summed(split: int) -> None:
    result = split_trial(_net(loss="sum"), _batch(), 0, split=split)
    assert not result.exact and result.difference > 0.3
    assert result.reason is not None and "summed over samples, not averaged" in result.reason


def test_in_batch_negatives_are_refused() -> None:
    result = split_trial(_net(loss="negatives"), _batch(), 0)
    assert not result.exact and result.difference > result.tolerance
    assert result.reason is not None and "in-batch negatives" in result.reason
    assert "summed" not in result.reason


def test_batch_norm_in_training_mode_makes_the_split_a_ghost_batch_split_not_an_exact_one() -> None:
    module = _net(batch_norm=True)
    result = split_trial(module, _batch(), 0)
    assert result.exact and result.difference < 1e-12  # the user's loss allows a split ...
    assert result.batch_norm_difference is not None and result.batch_norm_difference > 1e-3
    assert result.ghost and not result.exact_in_training  # ... which is not exact as it trains
    # without BatchNorm (dropout held fixed in both passes): exact as it trains
    plain = split_trial(_net(), _batch(), 0)
    assert plain.exact_in_training and not plain.ghost
    # in eval mode already: nothing batch-dependent, exact
    frozen = split_trial(_net(batch_norm=True).eval(), _batch(), 0)
    assert frozen.batch_norm_difference is None and frozen.exact_in_training
    # a refused split is neither
    summed = split_trial(_net(loss="sum", batch_norm=True), _batch(), 0)
    assert not summed.exact and not summed.ghost and not summed.exact_in_training


def test_the_run_is_left_as_it_was() -> None:
    module = _net(batch_norm=True, metric=True)
    module.net[3].eval()  # mixed training flags: the dropout in eval mode, the rest training
    batch = _batch()
    with torch.no_grad():  # a BatchNorm with statistics of its own, a metric with a state
        module.net[1].running_mean.uniform_()
        module.net[1].num_batches_tracked.fill_(7)
    module.training_step(_batch(12), 0)
    for p in module.parameters():
        p.grad = torch.randn_like(p)
    flags = [m.training for m in module.modules()]
    params = [p.detach().clone() for p in module.parameters()]
    grads = [p.grad.clone() for p in module.parameters()]
    stats = {k: v.clone() for k, v in module.net[1].state_dict().items()}
    metric = {name: getattr(module.acc, name).clone() for name in module.acc._defaults}
    updates = module.acc._update_count
    rng, python_rng = torch.get_rng_state(), random.getstate()
    copy = [t.clone() for t in batch]

    result = split_trial(module, batch, 3, split=4)

    assert result.exact and result.batch_norm_difference is not None and result.batch_norm_difference > 0
    assert [m.training for m in module.modules()] == flags
    assert all(torch.equal(p, q) for p, q in zip(module.parameters(), params))
    assert all(torch.equal(p.grad, g) for p, g in zip(module.parameters(), grads))
    assert all(torch.equal(v, stats[k]) for k, v in module.net[1].state_dict().items())
    assert all(torch.equal(getattr(module.acc, name), value) for name, value in metric.items())
    assert module.acc._update_count == updates == 1
    assert torch.equal(torch.get_rng_state(), rng) and random.getstate() == python_rng
    assert all(torch.equal(a, b) for a, b in zip(batch, copy))
    assert "log" not in vars(module) and "log_dict" not in vars(module)


def test_a_training_step_changing_its_batch_in_place_leaves_the_real_batch_alone() -> None:
    class InPlace(Net):
        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            batch[0].mul_(2)
            return super().training_step(batch, batch_idx)

    batch = _batch()
    copy = batch[0].clone()
    assert split_trial(InPlace().double(), batch, 0).exact
    assert torch.equal(batch[0], copy)


def test_a_training_step_without_batch_idx_is_tried() -> None:
    class NoIndex(Net):
        def training_step(self, batch):  # type: ignore[no-untyped-def,override]
            return super().training_step(batch, 0)

    assert split_trial(NoIndex().double(), _batch(), 5).exact


class TrialAtBatchEnd(pl.Callback):
    def __init__(self) -> None:
        self.results: list[SplitTrial] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        context = trainer.precision_plugin.train_step_context
        self.results.append(split_trial(pl_module, batch, batch_idx, context=context))


def test_self_log_during_the_trial_logs_nothing() -> None:
    # the trial runs in on_train_batch_end, where self.log is allowed: unpatched, the trial's
    # passes would add their samples to the epoch's sum
    module = Net(log=True)
    callback = TrialAtBatchEnd()
    x, y = _batch(64, torch.float32)
    trainer = cpu_trainer([callback], max_epochs=1)
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=16))
    assert len(callback.results) == 4 and all(r.exact for r in callback.results)
    assert trainer.callback_metrics["samples"].item() == 64.0  # the real steps' samples only
    assert "log" not in vars(module) and "log_dict" not in vars(module)


def test_no_loss_is_a_reason() -> None:
    result = split_trial(_net(loss="none"), _batch(), 0)
    assert not result.exact and result.reason == "training_step returned no loss for the whole batch"
    result = split_trial(_net(loss="none_small"), _batch(), 0)  # the chunks of 8 and 8 have a loss
    assert result.exact
    result = split_trial(_net(loss="none_small"), _batch(10), 0)  # chunks of 5: no loss
    assert result.reason == "training_step returned no loss for chunk 1 of 2"


def test_a_batch_too_small_or_without_tensors_is_a_reason() -> None:
    result = split_trial(_net(), _batch(1), 0)
    assert not result.exact and result.reason is not None and "a batch of 1 sample" in result.reason
    result = split_trial(_net(), ("a", 1.0), 0)
    assert result.reason is not None and "no tensor with a sample dimension" in result.reason


def test_an_exception_in_training_step_is_a_reason_and_leaves_the_module_as_it_was() -> None:
    module = _net(loss="raise")
    result = split_trial(module, _batch(), 0)
    assert not result.exact and result.reason is not None
    assert "could not be tried: RuntimeError: boom in training_step" in result.reason
    assert module.training and all(m.training for m in module.modules()) and "log" not in vars(module)


def test_out_of_memory_is_a_reason() -> None:
    result = split_trial(_net(loss="oom"), _batch(), 0)
    assert result.reason == "the split could not be tried: out of memory"


class _Raises(Net):
    """A module whose ``training_step`` raises ``error``."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        raise self.error


@pytest.mark.parametrize(
    ("error", "out_of_memory"),
    [
        (MemoryError(), True),  # the host's
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB"), True),
        (RuntimeError("MPS backend out of memory"), True),
        (ValueError("no memory of it"), False),
    ],
)
def test_the_trial_uses_the_backstops_out_of_memory_test(error: BaseException, out_of_memory: bool) -> None:
    result = split_trial(_Raises(error).double(), _batch(), 0)
    assert is_out_of_memory(error) is out_of_memory
    assert (result.reason == "the split could not be tried: out of memory") is out_of_memory


def test_a_zero_gradient_is_exact_when_the_split_is_zero_too() -> None:
    result = split_trial(_net(loss="zero"), _batch(), 0)
    assert result.exact and result.difference == 0.0


@pytest.mark.parametrize("split", [1, 0, 2.0, True])
def test_a_bad_split_is_refused(split: object) -> None:
    with pytest.raises(ValueError, match=r"split must be an int >= 2, got"):
        split_trial(_net(), _batch(), 0, split=split)  # type: ignore[arg-type]


def test_a_module_without_training_step_is_refused() -> None:
    with pytest.raises(TypeError, match=r"pl_module must be a LightningModule .* got Linear"):
        split_trial(nn.Linear(2, 2), _batch(), 0)


def test_the_trial_runs_under_inference_mode_and_no_grad() -> None:
    module, batch = _net(), _batch()
    with torch.inference_mode():
        assert split_trial(module, batch, 0).exact
        inference_batch = _batch()  # a batch of inference tensors (as a validation loop's)
        assert split_trial(module, inference_batch, 0).exact
    with torch.no_grad():
        assert split_trial(module, batch, 0).exact


class _LiveBytes(TorchDispatchMode):
    """The bytes of the CPU storages that ops create inside it, alive at once: now and at peak
    (a storage counted once however many tensors view it, until the last of them is freed)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.views: dict[int, tuple[int, int]] = {}  # data pointer -> (tensors alive, bytes)

    def _freed(self, key: int) -> None:
        count, size = self.views[key]
        self.views[key] = (count - 1, size)
        if count == 1:
            del self.views[key]
            self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
                storage = tensor.untyped_storage()
                key = storage.data_ptr()
                if key:
                    count, size = self.views.get(key, (0, storage.nbytes()))
                    if count == 0:
                        self.live += size
                        self.peak = max(self.peak, self.live)
                    self.views[key] = (count + 1, size)
                    weakref.finalize(tensor, self._freed, key)
        return out


class _Wide(pl.LightningModule):
    """An MLP whose parameters outweigh its activations a hundredfold at a batch of 8."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 10))

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)


def test_the_trial_holds_two_gradients_of_the_model_at_most() -> None:
    # the chunks' running sum and one chunk's (then the whole batch's), and autograd's
    # temporaries: 2.6x the parameters' bytes here (3.6x with the whole batch's gradient kept
    # beside the chunks', 4.6x with a new sum per chunk and a list of differences)
    module = _Wide()
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(8, 256, generator=g), torch.randint(0, 10, (8,), generator=g))
    parameter_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    with _LiveBytes() as meter:
        trial = split_trial(module, data, 0, split=4)
    assert trial.exact, trial.reason
    assert 2 * parameter_bytes <= meter.peak <= 2.75 * parameter_bytes, meter.peak / parameter_bytes
    assert meter.live == 0  # nothing the trial made outlives it
