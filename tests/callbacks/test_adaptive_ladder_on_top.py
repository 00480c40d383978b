"""AdaptiveBandLimit with band-limited basic blocks: the compression continuum on the top rung.

Checkpointed band-limited blocks keep only their kept spectrum
(:mod:`lightning_bandlimit.recompute.spectral`), so more compression also shrinks what the
checkpointed blocks keep: past the exact rungs the ladder compresses on the top rung.
"""

from pathlib import Path

import pytest
from _helpers import SCRIPTED_ADAPTIVE, cpu_trainer
from lightning.pytorch.callbacks import Callback

from lightning_bandlimit.callbacks import AdaptiveBandLimit
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.recompute.spectral import spectral_fallback
from lightning_bandlimit.recompute.switch import is_checkpointed

M = 1_000_000
TOTAL = 100 * M
# as test_adaptive_ladder.PRESSURE: near min_free, then under it for six checks (the ladder climbs
# one rung a check to the top, then compresses), then calm
PRESSURE = [80 * M] * 3 + [30 * M, 20_100_000] + [19_900_000] * 6 + [80 * M] * 20
BLOCKS = [f"backbone.{i}" for i in range(3, 11)]

pytestmark = pytest.mark.usefixtures("one_thread")


class _Spy(Callback):
    """Per step: blocks checkpointed, and those that kept their spectrum in the step."""

    def __init__(self) -> None:
        self.kept_spectrum: dict[int, int] = {}

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:  # type: ignore[no-untyped-def]
        blocks = [pl_module.get_submodule(name) for name in BLOCKS]
        self.kept_spectrum[trainer.global_step] = sum(
            is_checkpointed(b) and spectral_fallback(b) is None for b in blocks
        )


def test_past_the_exact_rungs_the_ladder_compresses_on_the_top_rung(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    callback = AdaptiveBandLimit(probe=ScriptedProbe(free=PRESSURE, total=TOTAL), **SCRIPTED_ADAPTIVE)
    spy = _Spy()
    trainer = cpu_trainer([callback, spy], default_root_dir=tmp_path, max_steps=20, limit_val_batches=0)
    data = SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16)
    with caplog.at_level("INFO"):
        trainer.fit(ImageClassifier("cifar_resnet18", width=4), data)
    assert callback.controller.continuum_on_top and callback.controller.lossy_rung == 4
    assert "the compression continuum runs on the top rung" in caplog.text
    timeline = [(d["step"], d["rung"], d["compression"]) for d in callback.decisions]
    lossy = [i for i, (_, _, c) in enumerate(timeline) if c > 0]
    assert lossy and all(timeline[i][1] == 4 for i in lossy), timeline  # compression on the top rung
    assert all(c == 0 for _, _, c in timeline[: lossy[0]])  # exact rungs first
    assert max(r for _, r, _ in timeline[: lossy[0]]) >= 1
    # in the steps that ran compressed on the top rung the high-resolution blocks kept their
    # spectrum (a downsampling block only where its spectrum and its shortcut's pixels together
    # are smaller than its input: from c = 0.45 at 32x32); on the 8x8 and 4x4 maps the padded
    # grid's band is larger than the map itself, and those blocks kept their input (said once,
    # with the reason)
    for i in lossy[:-1]:
        assert spy.kept_spectrum[timeline[i][0] + 1] >= 3, (timeline[i], spy.kept_spectrum)
    assert "checkpointed units keep their full input" in caplog.text
    assert "is not smaller than the block's input" in caplog.text
    released = timeline[lossy[-1] + 1 :]  # the lossy part given back first, then the rungs
    assert released and all(c == 0 for _, _, c in released)
    assert timeline[-1][1:] == (0, 0.0)
    # learned on the top rung: memory versus compression there falls with compression
    points = callback.controller.compression_memory.points
    assert len(points) >= 2 and points[max(points)] < points[min(points)]


@pytest.mark.parametrize(
    ("kwargs", "on_top"),
    [
        ({"memory_lean": False}, False),  # blocks that cannot keep a spectrum: rung 0
        ({"continuum_rung": "zero"}, False),  # the user's choice: faster, about as lean per step
        ({"memory_lean": False, "continuum_rung": "top"}, True),
    ],
)
def test_where_the_continuum_runs(tmp_path: Path, kwargs: dict, on_top: bool) -> None:
    callback = AdaptiveBandLimit(
        probe=ScriptedProbe(free=[80 * M] * 4, total=TOTAL), **{**SCRIPTED_ADAPTIVE, **kwargs}
    )
    trainer = cpu_trainer([callback], default_root_dir=tmp_path, max_steps=3, limit_val_batches=0)
    data = SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16)
    trainer.fit(ImageClassifier("cifar_resnet18", width=4), data)
    assert callback.controller.rungs == 4 and callback.controller.continuum_on_top == on_top
