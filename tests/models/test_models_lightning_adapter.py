"""The Lightning loop shape ``models/_lightning.py`` relies on, on the installed Lightning."""

import lightning
import pytest
from lightning.pytorch.loops.fit_loop import _FitLoop

from lightning_bandlimit.models import _lightning as adapter


def test_installed_lightning_has_the_shapes_the_adapter_uses() -> None:
    adapter.check_lightning_shapes.cache_clear()
    adapter.check_lightning_shapes()


def test_a_changed_shape_fails_naming_the_attribute_and_version(monkeypatch: pytest.MonkeyPatch) -> None:
    adapter.check_lightning_shapes.cache_clear()
    monkeypatch.delattr(_FitLoop, "setup_data")
    with pytest.raises(RuntimeError, match=rf"_FitLoop\.setup_data.*lightning {lightning.__version__}"):
        adapter.check_lightning_shapes()
    adapter.check_lightning_shapes.cache_clear()
