"""The private ``ModelCheckpoint`` shapes ``callbacks/_lightning.py`` relies on, on installed Lightning."""

from pathlib import Path

import lightning
import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_bandlimit.callbacks import ElasticCheckpoint
from lightning_bandlimit.callbacks import _lightning as adapter


def test_installed_lightning_has_the_shapes_the_adapter_uses() -> None:
    adapter.check_lightning_shapes.cache_clear()
    adapter.check_lightning_shapes()  # raises RuntimeError naming the attribute otherwise


@pytest.mark.parametrize("name", ["_find_last_checkpoints", "_save_last_checkpoint", "_monitor_candidates"])
def test_a_changed_shape_fails_naming_the_attribute_and_version(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    adapter.check_lightning_shapes.cache_clear()
    monkeypatch.delattr(ModelCheckpoint, name)
    with pytest.raises(RuntimeError, match=rf"ModelCheckpoint\.{name}.*lightning {lightning.__version__}"):
        adapter.check_lightning_shapes()
    adapter.check_lightning_shapes.cache_clear()


def test_last_saved_step_before_any_save() -> None:
    assert adapter.last_saved_step(ModelCheckpoint()) == 0


def test_the_last_checkpoint_is_found_in_the_default_directory(tmp_path: Path) -> None:
    # ckpt_path="last" is resolved before setup: the hook gives the callback its directory first
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    torch.save({"global_step": 0}, folder / "last.ckpt")
    trainer = pl.Trainer(
        default_root_dir=tmp_path, callbacks=[ElasticCheckpoint()], accelerator="cpu", logger=False
    )
    assert trainer.checkpoint_callback._find_last_checkpoints(trainer) == {str(folder / "last.ckpt")}
