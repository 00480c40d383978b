"""The private Lightning / torch shapes ``strategies/_lightning.py`` relies on, on the installed versions."""

import lightning
import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader

from lightning_bandlimit.strategies import ElasticSampler
from lightning_bandlimit.strategies import _lightning as adapter


def test_installed_lightning_has_the_shapes_the_adapter_uses() -> None:
    adapter.check_lightning_shapes.cache_clear()
    adapter.check_lightning_shapes()  # raises RuntimeError naming the attribute otherwise


def test_a_changed_shape_fails_naming_the_attribute_and_version(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter.check_lightning_shapes.cache_clear()
    monkeypatch.delattr(DDPStrategy, "_configure_launcher")
    with pytest.raises(RuntimeError, match=rf"_configure_launcher.*lightning {lightning.__version__}"):
        adapter.check_lightning_shapes()
    monkeypatch.undo()
    adapter.check_lightning_shapes.cache_clear()
    monkeypatch.delattr(pl.utilities.data, "_update_dataloader")
    with pytest.raises(RuntimeError, match=rf"_update_dataloader.*lightning {lightning.__version__}"):
        adapter.check_lightning_shapes()
    adapter.check_lightning_shapes.cache_clear()


def test_loader_with_sampler_keeps_the_loader_arguments() -> None:
    loader = DataLoader(list(range(10)), batch_size=2, shuffle=True, drop_last=True)
    sampler = ElasticSampler(10, batch_size=2, num_replicas=1, rank=0, shuffle=False)
    new = adapter.loader_with_sampler(loader, sampler)
    assert new.sampler is sampler and new.batch_size == 2 and new.drop_last
    assert [b.tolist() for b in new][:2] == [[0, 1], [2, 3]]


def test_set_scheduler_last_lr_is_what_get_last_lr_returns() -> None:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    adapter.set_scheduler_last_lr(scheduler, [0.25])
    assert scheduler.get_last_lr() == [0.25]


def test_set_batches_done_this_epoch_moves_the_epoch_loop_counters() -> None:
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    adapter.set_batches_done_this_epoch(trainer, 3)
    current = trainer.fit_loop.epoch_loop.batch_progress.current
    assert (current.ready, current.started, current.processed, current.completed) == (3, 3, 3, 3)


def test_launcher_hook_runs_before_the_launcher_is_configured() -> None:
    calls: list[str] = []

    class Hooked(adapter.LauncherHook, DDPStrategy):
        def before_launcher(self) -> None:
            calls.append("before")

    pl.Trainer(strategy=Hooked(), accelerator="cpu", devices=1, logger=False)
    assert calls == ["before"]
