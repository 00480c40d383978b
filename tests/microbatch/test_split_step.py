"""SplitStep in a real Trainer: a step's batch in chunks trains exactly as the whole batch.

**Tolerance: 1e-12 relative on the final weights, in float64.** A split step sums the chunks'
gradients, each scaled by its share of the batch, where the whole batch's backward sums the
samples' gradients in one reduction: the same sum in another order, exact to about 1e-16
relative per step; eight SGD steps with momentum amplify that by far less than 1e4. A real
difference (a chunk weighted wrong, gradients not zeroed, a chunk back-propagated twice) moves
the weights by 1e-3 or more. Under ``bf16-mixed`` each chunk's forward rounds differently to
bf16: 2e-2.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from _helpers import SplitDriver as Driver
from _helpers import cpu_trainer, run_python
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

TOLERANCE = 1e-12
SAMPLES, BATCH = 64, 16


class Net(pl.LightningModule):
    """An MLP on ``(x, y, index)`` batches: cross-entropy (a mean over the samples).

    Args:
        output: ``"tensor"`` or ``"dict"`` (``{"loss": ..., "extra": ...}``).
        none_at: ``training_step`` returns ``None`` for a batch (or chunk) holding this sample.
        metric: update a torchmetrics accuracy each step (read at each epoch's end).
    """

    def __init__(self, output: str = "tensor", none_at: int | None = None, metric: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))
        self.output, self.none_at = output, none_at
        self.acc = MulticlassAccuracy(num_classes=3) if metric else None
        self.epoch_acc: list[float] = []

    def whole_loss(self, batch: Any) -> torch.Tensor:
        x, y, _ = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y, index = batch
        if self.none_at is not None and bool((index == self.none_at).any()):
            return None
        logits = self.net(x)
        loss = nn.functional.cross_entropy(logits, y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        if self.acc is not None:
            self.acc.update(logits, y)
        return {"loss": loss, "extra": logits.detach().sum()} if self.output == "dict" else loss

    def on_train_epoch_end(self) -> None:
        if self.acc is not None:
            self.epoch_acc.append(float(self.acc.compute()))
            self.acc.reset()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class Manual(Net):
    """The same MLP with manual optimization."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        optimizer = self.optimizers()
        loss = self.whole_loss(batch)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss


class WholeLoss(pl.Callback):
    """Records the whole batch's loss at the weights the step starts from, and what the step returned."""

    def __init__(self) -> None:
        self.expected: list[float] = []
        self.returned: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        with torch.no_grad():
            self.expected.append(pl_module.whole_loss(batch).item())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        self.returned.append(outputs["loss"].item())


def _data(samples: int = SAMPLES, batch: int = BATCH, dtype: torch.dtype = torch.float64) -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(samples, 5, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randint(0, 3, (samples,), generator=g)
    return DataLoader(TensorDataset(x, y, torch.arange(samples)), batch_size=batch)


def _fit(
    split: int | None,
    make: Callable[[], pl.LightningModule] = Net,
    callbacks: tuple[pl.Callback, ...] = (),
    samples: int = SAMPLES,
    driver: Driver | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, pl.LightningModule, Driver | None, pl.Trainer]:
    """Train ``make()`` 2 epochs (``split=None``: no SplitStep at all); the final weights as one
    float64 vector, the module, the driver, the trainer."""
    torch.manual_seed(0)
    module = make()
    if split is not None and driver is None:
        driver = Driver(split)
    precision = kwargs.pop("precision", "64-true")
    trainer = cpu_trainer(
        [*callbacks, *([driver] if driver is not None else [])], max_epochs=2, precision=precision, **kwargs
    )
    trainer.fit(module, _data(samples, dtype=torch.float64 if precision == "64-true" else torch.float32))
    weights = torch.cat([p.detach().double().flatten() for p in module.parameters()])
    return weights, module, driver, trainer


@functools.cache
def _whole(**kwargs: Any) -> torch.Tensor:
    """The unsplit run's final weights (cached per configuration)."""
    return _fit(None, **kwargs)[0]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("split", [2, 3, 4])  # 3: chunks of 6, 5 and 5
def test_split_trains_the_whole_batch_weights(split: int) -> None:
    weights, _, driver, _ = _fit(split)
    assert driver is not None and driver.chunks == [split] * 8
    assert _relative(weights, _whole()) < TOLERANCE


@pytest.mark.parametrize("split", [2, 3])
def test_split_with_gradient_accumulation(split: int) -> None:
    weights, _, driver, _ = _fit(split, accumulate_grad_batches=2)
    assert driver is not None and driver.chunks == [split] * 8
    assert _relative(weights, _whole(accumulate_grad_batches=2)) < TOLERANCE
    assert _relative(weights, _whole()) > 1e-3  # accumulation trains other weights: the check can fail


def test_split_with_gradient_clipping() -> None:
    weights, *_ = _fit(2, gradient_clip_val=0.05)
    assert _relative(weights, _whole(gradient_clip_val=0.05)) < TOLERANCE
    assert _relative(weights, _whole()) > 1e-3  # the clipping bites


def test_split_with_a_dict_output() -> None:
    weights, _, driver, _ = _fit(3, partial(Net, output="dict"))
    assert _relative(weights, _whole()) < TOLERANCE
    assert driver is not None and all(set(out) == {"loss", "extra"} for out in driver.outputs)


def test_split_under_bf16_mixed() -> None:
    weights, *_ = _fit(4, precision="bf16-mixed")
    whole = _whole(precision="bf16-mixed")
    assert _relative(weights, whole) < 2e-2
    assert _relative(weights, _whole()) < 2e-2  # and near the float64 run's


def test_the_returned_loss_is_the_whole_batch_loss() -> None:
    record = WholeLoss()
    _, _, driver, _ = _fit(3, callbacks=(record,))
    assert driver is not None and driver.chunks == [3] * 8
    assert len(record.returned) == 8
    for returned, expected in zip(record.returned, record.expected):
        assert returned == pytest.approx(expected, rel=TOLERANCE, abs=0)


def test_a_batch_smaller_than_the_split_runs_in_fewer_chunks_and_a_batch_of_one_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 66 samples: batches of 16, 16, 16, 16 and 2; at split 4 the last runs in 2 chunks
    with caplog.at_level("INFO"):
        weights, _, driver, _ = _fit(4, samples=66)
    assert driver is not None and driver.chunks == [4, 4, 4, 4, 2] * 2
    assert _relative(weights, _whole(samples=66)) < TOLERANCE
    # 65 samples: the last batch holds one sample: it runs whole, said once
    with caplog.at_level("INFO"):
        weights, _, driver, _ = _fit(4, samples=65)
    assert driver is not None and driver.chunks == [4, 4, 4, 4, 1] * 2
    assert _relative(weights, _whole(samples=65)) < TOLERANCE
    assert caplog.text.count("Driver: a batch too small to split") == 1


def test_manual_optimization_runs_whole_with_one_message(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO"):
        weights, _, driver, _ = _fit(2, Manual)
    assert driver is not None and driver.chunks == [1] * 8
    assert torch.equal(weights, _fit(None, Manual)[0])
    assert caplog.text.count("the micro-batch split needs automatic optimization") == 1


def test_a_step_returning_none_is_skipped() -> None:
    weights, _, driver, _ = _fit(2, partial(Net, none_at=5))  # batch 0 of each epoch: skipped
    assert driver is not None and driver.outputs[0] == {}  # Lightning's output of a skipped step
    whole = _fit(None, partial(Net, none_at=5))[0]
    assert _relative(weights, whole) < TOLERANCE
    assert _relative(weights, _whole()) > 1e-3  # the skipped steps trained nothing


def test_a_chunk_returning_none_skips_its_step(caplog: pytest.LogCaptureFixture) -> None:
    # sample 28 is in the second chunk of batch 1 (samples 16-31, chunks 16-23 and 24-31):
    # the first chunk is back-propagated already; its gradient must not reach the optimizer
    with caplog.at_level("INFO"):
        weights, _, driver, _ = _fit(2, partial(Net, none_at=28))
    assert driver is not None and driver.outputs[1] == {} and driver.chunks[1] == 2
    assert _relative(weights, _fit(None, partial(Net, none_at=28))[0]) < TOLERANCE
    assert caplog.text.count("training_step returned no loss for a chunk of a split batch") == 1


def test_torchmetrics_updated_per_chunk_equal_the_whole_batch() -> None:
    _, split, *_ = _fit(3, partial(Net, metric=True))
    _, whole, *_ = _fit(None, partial(Net, metric=True))
    assert len(split.epoch_acc) == 2 and split.epoch_acc == whole.epoch_acc
    assert split.epoch_acc[0] != split.epoch_acc[1]  # two epochs' values: the metric was read each epoch


def test_an_epoch_mean_logged_per_chunk_is_the_whole_batch_mean() -> None:
    # split 3: chunks of 6, 5 and 5 samples; each chunk's value weighs by its own size
    *_, trainer = _fit(3)
    *_, whole = _fit(None)
    split_mean, whole_mean = trainer.callback_metrics["train_loss"], whole.callback_metrics["train_loss"]
    assert split_mean.item() == pytest.approx(whole_mean.item(), rel=TOLERANCE, abs=0)


def test_remove_restores_the_strategy_and_the_module() -> None:
    _, module, driver, trainer = _fit(2)
    assert driver is not None and not driver.step.installed
    assert "training_step" not in vars(trainer.strategy)
    assert "optimizer_zero_grad" not in vars(module)
    assert trainer.strategy.training_step.__func__ is type(trainer.strategy).training_step


def test_remove_after_a_step_left_open_restores_the_zero_grad_hook() -> None:
    # a driver that never ends its steps: the last split step's no-op zero_grad is still there
    driver = Driver(2, remove=False)
    _, module, _, trainer = _fit(2, driver=driver)
    assert "optimizer_zero_grad" in vars(module) and "training_step" in vars(trainer.strategy)
    driver.step.remove()
    assert "optimizer_zero_grad" not in vars(module) and "training_step" not in vars(trainer.strategy)
    assert driver.step.chunks == 1 and not driver.step.installed


def test_split_one_leaves_the_step_alone() -> None:
    weights, _, driver, _ = _fit(1)
    assert driver is not None and driver.chunks == [1] * 8
    assert torch.equal(weights, _whole())


@pytest.mark.slow
def test_ddp_split_trains_the_whole_batch_weights_with_one_all_reduce_per_step(tmp_path: Path) -> None:
    # ddp_split_step_script.py: 2 gloo processes train whole, then at split 2, in one launch
    script = Path(__file__).with_name("ddp_split_step_script.py")
    run_python(str(script), cwd=tmp_path, timeout=120, BANDLIMIT_OUT=str(tmp_path))
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for report in ranks:
        whole, split = report["whole"], report["split"]
        assert whole["steps"] == split["steps"] == 8 and split["chunks"] == [2] * 8
        assert _relative(torch.tensor(split["weights"]), torch.tensor(whole["weights"])) < TOLERANCE
        # the chunks before the last are held back (no_sync): one all-reduce per optimizer step
        assert split["allreduces"] == whole["allreduces"] >= 8 and whole["allreduces"] % 8 == 0
    assert ranks[0]["split"]["weights"] == ranks[1]["split"]["weights"]  # the ranks agree


def test_remove_gives_back_a_wrapper_and_a_zero_grad_hook_that_were_there_before() -> None:
    calls: list[str] = []

    class Wrapped(Driver):
        def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            original = trainer.strategy.training_step

            def outer(*args: Any, **kwargs: Any) -> Any:  # another library's wrapper, installed first
                calls.append("outer")
                return original(*args, **kwargs)

            trainer.strategy.training_step = outer  # type: ignore[method-assign]
            self.outer = outer
            pl_module.optimizer_zero_grad = self.own_zero_grad  # type: ignore[method-assign]
            super().on_fit_start(trainer, pl_module)

        def own_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
            calls.append("zero_grad")
            optimizer.zero_grad()

    driver = Wrapped(2)
    _, module, _, trainer = _fit(2, driver=driver)
    assert vars(trainer.strategy)["training_step"] is driver.outer  # not the class's: the wrapper's
    assert vars(module)["optimizer_zero_grad"] == driver.own_zero_grad
    assert calls.count("outer") == 16 and calls.count("zero_grad") == 8  # 8 steps, 2 chunks, zeroed once
