"""CIFAR10DataModule and its readers, on tiny fake folders in the real CIFAR-10 format."""

from __future__ import annotations

import gc
import pickle
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from _helpers import cpu_trainer
from torch import nn

from lightning_bandlimit.data.cifar10 import CIFAR10DataModule
from lightning_bandlimit.data.cifar10_batches import (
    CIFAR10_CLASSES,
    CIFAR10_TRAIN_FILES,
    load_cifar10_batches,
    write_fake_cifar10,
)

N_PER_BATCH = 8  # 40 training images in all
N_TEST = 12


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """``tmp_path/cifar-10-batches-py`` with 5 x 8 training and 12 test images."""
    return write_fake_cifar10(tmp_path, n_train_per_batch=N_PER_BATCH, n_test=N_TEST, seed=1)


def read_raw(path: Path) -> dict:
    with path.open("rb") as handle:
        return pickle.load(handle, encoding="bytes")


def write_raw(path: Path, record: object) -> None:
    with path.open("wb") as handle:
        pickle.dump(record, handle, protocol=2)


def all_labels(dataset) -> torch.Tensor:
    return torch.stack([dataset[i][1] for i in range(len(dataset))])


# ----------------------------------------------------------------------------- round trip


def test_known_pixels_round_trip(folder: Path) -> None:
    # Overwrite one image with a pattern whose channel-major layout is checkable by hand.
    record = read_raw(folder / "data_batch_3")
    pattern = (np.arange(3072) * 7 % 256).astype(np.uint8)
    record[b"data"][5] = pattern
    record[b"labels"][5] = 9
    write_raw(folder / "data_batch_3", record)

    dm = CIFAR10DataModule(folder.parent, batch_size=4, val_size=0, augment=False)
    dm.setup("fit")
    # val_size=0: the training split is the five batches in file order.
    image, label = dm.train_set[2 * N_PER_BATCH + 5]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert label.dtype == torch.int64 and int(label) == 9
    for c, y, x in [(0, 0, 0), (0, 0, 31), (1, 5, 7), (2, 31, 31), (2, 17, 3)]:
        expected = pattern[c * 1024 + y * 32 + x] / 255
        assert image[c, y, x].item() == pytest.approx(expected, abs=1e-7), (c, y, x)
    assert image.min() == 0 and image.max() == 1  # the pattern covers 0 and 255


def test_every_image_and_label_matches_the_files(folder: Path) -> None:
    dm = CIFAR10DataModule(folder.parent, val_size=0, augment=False)
    dm.setup()
    raw = [read_raw(folder / name) for name in CIFAR10_TRAIN_FILES]
    data = np.concatenate([r[b"data"] for r in raw]).reshape(-1, 3, 32, 32)
    labels = [label for r in raw for label in r[b"labels"]]
    images = torch.stack([dm.train_set[i][0] for i in range(len(dm.train_set))])
    torch.testing.assert_close(images, torch.from_numpy(data).float() / 255, rtol=0, atol=1e-7)
    assert all_labels(dm.train_set).tolist() == labels
    assert 0 <= images.min() and images.max() <= 1

    test = read_raw(folder / "test_batch")
    test_images = torch.stack([dm.test_set[i][0] for i in range(N_TEST)])
    expected = torch.from_numpy(test[b"data"].reshape(-1, 3, 32, 32)).float() / 255
    torch.testing.assert_close(test_images, expected, rtol=0, atol=1e-7)
    assert all_labels(dm.test_set).tolist() == test[b"labels"]
    assert all_labels(dm.predict_set).tolist() == test[b"labels"]


def test_split_sizes_disjoint_and_seeded(folder: Path) -> None:
    def split(seed: int) -> tuple[list[int], list[int]]:
        dm = CIFAR10DataModule(folder, val_size=10, seed=seed)
        dm.setup("fit")
        return dm.train_set.indices.tolist(), dm.val_set.indices.tolist()

    train, val = split(0)
    assert len(train) == 5 * N_PER_BATCH - 10 and len(val) == 10
    assert not set(train) & set(val)
    assert sorted(train + val) == list(range(5 * N_PER_BATCH))
    assert split(0) == (train, val)
    assert split(1)[1] != val


def test_val_split_yields_the_held_out_images(folder: Path) -> None:
    dm = CIFAR10DataModule(folder, val_size=6, seed=3, augment=True)
    dm.setup("fit")
    full = CIFAR10DataModule(folder, val_size=0, augment=False)
    full.setup("fit")
    for i, row in enumerate(dm.val_set.indices.tolist()):
        image, label = dm.val_set[i]
        ref_image, ref_label = full.train_set[row]
        assert torch.equal(image, ref_image) and int(label) == int(ref_label)


def test_both_folder_forms_give_the_same_data(folder: Path) -> None:
    parent = CIFAR10DataModule(folder.parent, val_size=5, augment=False)
    itself = CIFAR10DataModule(str(folder), val_size=5, augment=False)
    parent.setup()
    itself.setup()
    assert torch.equal(parent.train_set[3][0], itself.train_set[3][0])
    assert torch.equal(parent.test_set[0][0], itself.test_set[0][0])


def test_classes_from_meta_and_default(folder: Path) -> None:
    dm = CIFAR10DataModule(folder)
    assert dm.classes == CIFAR10_CLASSES
    meta = read_raw(folder / "batches.meta")
    meta[b"label_names"] = [f"c{i}".encode() for i in range(10)]
    write_raw(folder / "batches.meta", meta)
    assert CIFAR10DataModule(folder).classes == tuple(f"c{i}" for i in range(10))
    (folder / "batches.meta").unlink()
    assert CIFAR10DataModule(folder).classes == CIFAR10_CLASSES


# ----------------------------------------------------------------------------- augmentation


def epoch_images(dm: CIFAR10DataModule) -> torch.Tensor:
    """Training images in dataset order for one pass (augmentation drawn anew)."""
    return torch.stack([dm.train_set[i][0] for i in range(len(dm.train_set))])


def test_augmentation_changes_train_images_between_epochs(folder: Path) -> None:
    pl.seed_everything(0, verbose=False)
    dm = CIFAR10DataModule(folder, val_size=5, augment=True)
    dm.setup("fit")
    first, second = epoch_images(dm), epoch_images(dm)
    assert not torch.equal(first, second)
    differing = [not torch.equal(a, b) for a, b in zip(first, second)]
    assert sum(differing) > len(differing) // 2
    for images in (first, second):
        assert images.min() >= 0 and images.max() <= 1
    # Zero padding shows up as black borders in some crops; a random uint8 image has few zeros.
    assert (first == 0).float().mean() > 0.01

    plain = CIFAR10DataModule(folder, val_size=5, augment=False)
    plain.setup("fit")
    unaugmented = epoch_images(plain)
    # Each augmented image is a shifted (and possibly flipped) copy of the original.
    for aug, orig in zip(first, unaugmented):
        assert any(
            torch.equal(torch.nn.functional.pad(o, (4, 4, 4, 4))[:, t : t + 32, u : u + 32], aug)
            for o in (orig, orig.flip(-1))
            for t in range(9)
            for u in range(9)
        )


def test_augmentation_is_reproducible_with_a_seed(folder: Path) -> None:
    dm = CIFAR10DataModule(folder, val_size=5, augment=True)
    dm.setup("fit")
    pl.seed_everything(7, verbose=False)
    first = epoch_images(dm)
    pl.seed_everything(7, verbose=False)
    assert torch.equal(first, epoch_images(dm))


def test_no_augmentation_when_disabled_and_on_eval_splits(folder: Path) -> None:
    dm = CIFAR10DataModule(folder, val_size=5, augment=False)
    dm.setup()
    assert torch.equal(epoch_images(dm), epoch_images(dm))

    augmented = CIFAR10DataModule(folder, val_size=5, augment=True)
    augmented.setup()
    for name in ("val_set", "test_set", "predict_set"):
        split = getattr(augmented, name)
        reference = getattr(dm, name)
        for i in range(len(split)):
            assert torch.equal(split[i][0], reference[i][0]), (name, i)


# ----------------------------------------------------------------------------- data loaders


def test_dataloader_batches(folder: Path) -> None:
    dm = CIFAR10DataModule(folder, batch_size=16, val_size=5, num_workers=0)
    dm.setup()
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (16, 3, 32, 32) and images.dtype == torch.float32
    assert labels.shape == (16,) and labels.dtype == torch.int64
    # drop_last=False: 35 training images make batches of 16, 16, 3.
    assert [len(b[1]) for b in dm.train_dataloader()] == [16, 16, 3]
    assert sum(len(b[1]) for b in dm.val_dataloader()) == 5
    test_labels = torch.cat([b[1] for b in dm.test_dataloader()])
    assert test_labels.tolist() == all_labels(dm.test_set).tolist()  # not shuffled
    assert sum(len(b[0]) for b in dm.predict_dataloader()) == N_TEST


def test_train_loader_shuffles(folder: Path) -> None:
    dm = CIFAR10DataModule(folder, batch_size=64, val_size=0, augment=False)
    dm.setup("fit")
    torch.manual_seed(0)
    ((images, _),) = list(dm.train_dataloader())
    assert not torch.equal(images, epoch_images(dm))

    # Same multiset of images: sort by a per-image checksum.
    def checksums(batch: torch.Tensor) -> torch.Tensor:
        return batch.sum(dim=(1, 2, 3)).sort().values

    torch.testing.assert_close(checksums(images), checksums(epoch_images(dm)))


def test_loader_before_setup_raises(folder: Path) -> None:
    with pytest.raises(RuntimeError, match="setup"):
        CIFAR10DataModule(folder).train_dataloader()


def test_hyperparameters_saved(folder: Path) -> None:
    dm = CIFAR10DataModule(folder, batch_size=7, val_size=3, seed=5, augment=False)
    assert dm.hparams.batch_size == 7 and dm.hparams.val_size == 3 and dm.hparams.seed == 5
    assert dm.hparams.augment is False


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
        ({"val_size": -1}, "val_size must be >= 0, got -1"),
        ({"num_workers": -2}, "num_workers must be >= 0, got -2"),
    ],
)
def test_bad_arguments(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CIFAR10DataModule(tmp_path, **kwargs)


def test_non_int_argument(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="batch_size"):
        CIFAR10DataModule(tmp_path, batch_size=2.5)  # type: ignore[arg-type]


def test_bad_stage_and_fake_counts(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="stage must be one of .*got 'train'"):
        CIFAR10DataModule(folder).setup("train")
    with pytest.raises(ValueError, match="n_test must be >= 0, got -1"):
        write_fake_cifar10(tmp_path / "fake", n_test=-1)


def test_val_size_too_large(folder: Path) -> None:
    dm = CIFAR10DataModule(folder, val_size=5 * N_PER_BATCH)
    with pytest.raises(ValueError, match="val_size must be smaller than the 40"):
        dm.setup("fit")
    dm.setup("test")  # the test split does not depend on val_size
    assert len(dm.test_set) == N_TEST


def test_missing_folder(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    dm = CIFAR10DataModule(missing)  # __init__ stays cheap
    for step in (dm.prepare_data, dm.setup):
        with pytest.raises(FileNotFoundError) as info:
            step()
        assert str(missing) in str(info.value) and "data_batch_1" in str(info.value)


def test_empty_folder_lists_expectations(tmp_path: Path) -> None:
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="data_batch_1.*test_batch") as info:
        CIFAR10DataModule(tmp_path).prepare_data()
    assert "tar -xzf" in str(info.value)


def test_missing_test_batch(folder: Path) -> None:
    (folder / "test_batch").unlink()
    dm = CIFAR10DataModule(folder.parent)
    with pytest.raises(FileNotFoundError, match="test_batch") as info:
        dm.prepare_data()
    assert str(folder) in str(info.value) and "data_batch_1" in str(info.value)  # lists what was found
    with pytest.raises(FileNotFoundError, match="test_batch"):
        dm.setup("fit")


def test_corrupted_pickle(folder: Path) -> None:
    (folder / "data_batch_2").write_bytes(b"\x80\x02}q\x00(garbage")
    with pytest.raises(ValueError, match="data_batch_2.*could not unpickle"):
        CIFAR10DataModule(folder).setup("fit")


def test_pickle_with_foreign_globals_is_refused(folder: Path) -> None:
    write_raw(folder / "test_batch", {b"data": Path("x"), b"labels": []})
    with pytest.raises(ValueError, match="test_batch.*refusing to load global pathlib"):
        CIFAR10DataModule(folder).setup("test")


def mutate(folder: Path, name: str, key: bytes, value: object) -> None:
    record = read_raw(folder / name)
    if value is None:
        del record[key]
    else:
        record[key] = value
    write_raw(folder / name, record)


@pytest.mark.parametrize(
    ("name", "key", "value", "message"),
    [
        (
            "data_batch_4",
            b"data",
            np.zeros((N_PER_BATCH, 3, 32, 32), np.uint8),
            r"shape \(N, 3072\).*\(8, 3, 32, 32\)",
        ),
        ("data_batch_1", b"data", np.zeros((N_PER_BATCH, 3000), np.uint8), r"\(8, 3000\)"),
        ("data_batch_5", b"labels", [10] * N_PER_BATCH, r"0\.\.9.*10\.\.10"),
        ("data_batch_5", b"labels", [-1] + [0] * (N_PER_BATCH - 1), r"0\.\.9.*-1\.\.0"),
        ("test_batch", b"labels", [0] * (N_TEST - 1), "12 images but 11 labels"),
        ("test_batch", b"labels", None, "b'data'"),
        ("data_batch_2", b"data", np.zeros((N_PER_BATCH, 3072), np.float32), "uint8"),
    ],
)
def test_malformed_batches(folder: Path, name: str, key: bytes, value: object, message: str) -> None:
    mutate(folder, name, key, value)
    with pytest.raises(ValueError, match=message) as info:
        CIFAR10DataModule(folder, val_size=1).setup()
    assert name in str(info.value)


def test_not_a_dict(folder: Path) -> None:
    write_raw(folder / "data_batch_1", [1, 2, 3])
    with pytest.raises(ValueError, match="data_batch_1.*found a list"):
        load_cifar10_batches(folder)


def test_malformed_meta(folder: Path) -> None:
    write_raw(folder / "batches.meta", {b"label_names": [b"a", b"b"]})
    with pytest.raises(ValueError, match="batches.meta.*10 distinct"):
        CIFAR10DataModule(folder).setup("test")


# ----------------------------------------------------------------------------- Lightning


class TinyClassifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
        self.seen_train = 0
        self.seen_val = 0

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        assert images.shape[1:] == (3, 32, 32) and labels.dtype == torch.int64
        self.seen_train += len(labels)
        return nn.functional.cross_entropy(self.net(images), labels)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        images, labels = batch
        self.seen_val += len(labels)
        self.log("val_loss", nn.functional.cross_entropy(self.net(images), labels))

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        images, labels = batch
        self.log("test_loss", nn.functional.cross_entropy(self.net(images), labels))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_fit_and_test(folder: Path) -> None:
    pl.seed_everything(0, verbose=False)
    dm = CIFAR10DataModule(folder.parent, batch_size=4, val_size=8)
    model = TinyClassifier()
    before = model.net[1].weight.detach().clone()
    trainer = cpu_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    assert trainer.state.finished
    assert model.seen_train == 8 and model.seen_val == 4
    assert not torch.equal(before, model.net[1].weight)
    assert torch.isfinite(trainer.callback_metrics["val_loss"])
    (result,) = trainer.test(model, datamodule=dm, verbose=False)
    assert np.isfinite(result["test_loss"])


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_reads_pickles_of_any_protocol_and_numpy_1_names(folder: Path, protocol: int) -> None:
    record = read_raw(folder / "test_batch")
    payload = pickle.dumps(record, protocol=protocol)
    if protocol == 2:
        # The official files were written by Python 2 with NumPy 1: ``numpy.core.multiarray``.
        assert b"numpy._core.multiarray\n" in payload
        payload = payload.replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
    (folder / "test_batch").write_bytes(payload)
    images, labels = load_cifar10_batches(folder, ["test_batch"])["test_batch"]
    assert torch.equal(images, torch.from_numpy(record[b"data"].reshape(-1, 3, 32, 32)))
    assert labels.tolist() == record[b"labels"]


def test_worker_processes(folder: Path) -> None:
    dm = CIFAR10DataModule(folder, batch_size=8, val_size=8, num_workers=2, augment=False)
    dm.setup()
    loader = dm.val_dataloader()
    assert loader.persistent_workers and loader.num_workers == 2
    images = torch.cat([b[0] for b in loader])
    assert torch.equal(images, torch.stack([dm.val_set[i][0] for i in range(8)]))
    # Persistent workers live as long as the loader (a reference cycle with its iterator):
    # stop them here rather than whenever the garbage collector gets to them.
    del loader
    gc.collect()
