"""The CIFAR-10 python batch files: finding, reading and validating them; writing fakes for tests.

The expected layout is the one the official ``cifar-10-python.tar.gz`` extracts to::

    <data_dir>/cifar-10-batches-py/
        data_batch_1 ... data_batch_5   # 10000 training images each
        test_batch                      # 10000 test images
        batches.meta                    # optional: class names

``data_dir`` may also be the ``cifar-10-batches-py`` folder itself. Each batch is a pickle of
a dict with ``b"data"`` (``N x 3072`` uint8, channel-major RGB 32x32: the 1024 red values row
by row, then green, then blue) and ``b"labels"`` (``N`` ints in ``0..9``).
:func:`write_fake_cifar10` writes a tiny folder in the same format for tests.

The pickles are read with a restricted unpickler that only builds plain containers and
NumPy arrays, so a tampered file raises :class:`ValueError` instead of running code.

Why not ``torchvision.datasets.CIFAR10``: it checks every file against the MD5 sums of the
official release (so the fake folders of :func:`write_fake_cifar10` are "not found or
corrupted"), requires ``batches.meta`` and the ``<root>/cifar-10-batches-py`` layout, reads
with plain :func:`pickle.load` (a tampered file runs code), and reads whole splits only, with
one error for every problem instead of a message naming the file and what is wrong in it.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = write_fake_cifar10(tmp, n_train_per_batch=2, n_test=3)
    ...     batches = load_cifar10_batches(tmp)
    >>> {name: len(labels) for name, (images, labels) in batches.items()}["test_batch"]
    3
"""

from __future__ import annotations

import codecs
import os
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_bandlimit.utils.validation import check_int

__all__ = [
    "CIFAR10_CLASSES",
    "CIFAR10_FOLDER",
    "CIFAR10_META_FILE",
    "CIFAR10_TEST_FILE",
    "CIFAR10_TRAIN_FILES",
    "load_cifar10_batches",
    "load_cifar10_classes",
    "resolve_cifar10_dir",
    "write_fake_cifar10",
]

CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_TRAIN_FILES: tuple[str, ...] = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
CIFAR10_META_FILE = "batches.meta"
CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)

_REQUIRED_FILES: tuple[str, ...] = (*CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE)
_ARCHIVE = "cifar-10-python.tar.gz"
_PIXELS = 3 * 32 * 32
_EXPECTED_LAYOUT = (
    f"a folder containing {CIFAR10_FOLDER}/ or that folder itself, holding the CIFAR-10 python "
    f"batches {', '.join(_REQUIRED_FILES)} (and optionally {CIFAR10_META_FILE})"
)
_EXPECTED_FORMAT = (
    'a pickled dict with b"data" (N x 3072 uint8, channel-major RGB 32x32) and b"labels" (N ints in 0..9)'
)


def _pickle_allowlist() -> dict[tuple[str, str], Any]:
    # The callables NumPy's own pickles refer to, found through the installed NumPy so that
    # both ``numpy.core`` (NumPy 1, Python 2 era files) and ``numpy._core`` names resolve
    # without importing deprecated modules.
    reconstruct = np.ndarray(0).__reduce__()[0]
    scalar = np.int64(0).__reduce__()[0]
    frombuffer = np.zeros(1).__reduce_ex__(5)[0]
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): codecs.encode,  # bytes under pickle protocol 2
    }
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{core}.multiarray", "scalar")] = scalar
        allowed[(f"{core}.numeric", "_frombuffer")] = frombuffer
    return allowed


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that only resolves the globals NumPy arrays need."""

    _allowed = _pickle_allowlist()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name} (only NumPy arrays and plain containers "
                "are allowed in CIFAR-10 batches)"
            ) from None


def _unpickle(path: Path) -> Any:
    try:
        with path.open("rb") as handle:
            return _RestrictedUnpickler(handle, encoding="bytes").load()
    except OSError:
        raise
    except Exception as err:  # unpickling can fail in many ways on a corrupted file
        raise ValueError(
            f"{path}: could not unpickle ({type(err).__name__}: {err}); expected {_EXPECTED_FORMAT}"
        ) from err


def _get(record: dict[Any, Any], key: str) -> Any:
    # Python 2 pickles read with encoding="bytes" have bytes keys; Python 3 ones may have str keys.
    if key.encode() in record:
        return record[key.encode()]
    return record.get(key)


def _describe_keys(record: dict[Any, Any]) -> str:
    return "[" + ", ".join(repr(k) for k in list(record)[:10]) + ("" if len(record) <= 10 else ", ...") + "]"


def resolve_cifar10_dir(data_dir: str | os.PathLike[str]) -> Path:
    """Find the folder holding the CIFAR-10 python batches and check that all files are there.

    Args:
        data_dir: the folder that contains ``cifar-10-batches-py/``, or that folder itself.

    Returns:
        The folder holding ``data_batch_1`` .. ``data_batch_5`` and ``test_batch``.

    Raises:
        FileNotFoundError: ``data_dir`` does not exist, or a batch file is missing; the message
            names the path, the expected files and what was found.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     batches = write_fake_cifar10(tmp, n_train_per_batch=1, n_test=1)
        ...     resolve_cifar10_dir(tmp) == resolve_cifar10_dir(batches) == batches
        True
    """
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise FileNotFoundError(
            f"CIFAR-10 folder {str(root)!r} {what}; expected {_EXPECTED_LAYOUT}. "
            "This data module never downloads: extract cifar-10-python.tar.gz there first."
        )
    folder = root / CIFAR10_FOLDER if (root / CIFAR10_FOLDER).is_dir() else root
    missing = [name for name in _REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        found = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
        shown = ", ".join(found[:20]) + (f", ... ({len(found)} entries)" if len(found) > 20 else "")
        hint = (
            f" Found the archive {_ARCHIVE}: extract it (tar -xzf {_ARCHIVE})."
            if (folder / _ARCHIVE).is_file()
            else ""
        )
        raise FileNotFoundError(
            f"CIFAR-10 batches missing in {str(folder)!r}: {', '.join(missing)}; expected "
            f"{_EXPECTED_LAYOUT}. Found: {shown or 'nothing (empty folder)'}.{hint}"
        )
    return folder


def _read_batch(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    record = _unpickle(path)
    if not isinstance(record, dict):
        found = type(record).__name__
        raise ValueError(f"{path}: expected {_EXPECTED_FORMAT}, found a {found}")  # noqa: TRY004
    data, labels = _get(record, "data"), _get(record, "labels")
    if data is None or labels is None:
        raise ValueError(
            f"{path}: expected {_EXPECTED_FORMAT}, found a dict with keys {_describe_keys(record)}"
        )
    try:
        data = np.asarray(data)
        labels = np.asarray(labels)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: expected {_EXPECTED_FORMAT}; could not read arrays ({err})") from err
    if data.ndim != 2 or data.shape[1] != _PIXELS:
        raise ValueError(
            f'{path}: b"data" must have shape (N, {_PIXELS}) (N images of 3x32x32), '
            f"found shape {tuple(data.shape)}"
        )
    if data.dtype != np.uint8:
        if data.dtype.kind not in "iu" or (data.size and (data.min() < 0 or data.max() > 255)):
            raise ValueError(f'{path}: b"data" must be uint8 pixel values, found dtype {data.dtype}')
        data = data.astype(np.uint8)
    if labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        raise ValueError(
            f'{path}: b"labels" must be a flat list of ints, found dtype {labels.dtype} '
            f"and shape {tuple(labels.shape)}"
        )
    if len(labels) != len(data):
        raise ValueError(f"{path}: {len(data)} images but {len(labels)} labels")
    if labels.size and (labels.min() < 0 or labels.max() >= len(CIFAR10_CLASSES)):
        raise ValueError(
            f"{path}: labels must lie in 0..{len(CIFAR10_CLASSES) - 1}, "
            f"found range {int(labels.min())}..{int(labels.max())}"
        )
    images = torch.from_numpy(np.ascontiguousarray(data).reshape(-1, 3, 32, 32).copy())
    return images, torch.from_numpy(labels.astype(np.int64))


def load_cifar10_batches(
    data_dir: str | os.PathLike[str], names: Iterable[str] | None = None
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Read and validate CIFAR-10 python batches.

    Args:
        data_dir: the folder that contains ``cifar-10-batches-py/``, or that folder itself.
        names: which batches to read (default: ``data_batch_1`` .. ``data_batch_5`` and
            ``test_batch``). All six files must exist whatever is read.

    Returns:
        ``{name: (images, labels)}`` with ``images`` a uint8 tensor ``(N, 3, 32, 32)`` and
        ``labels`` an int64 tensor ``(N,)``, in file order.

    Raises:
        FileNotFoundError: the folder or one of the batch files is missing.
        ValueError: a file is not in the CIFAR-10 format (not unpicklable, missing keys, wrong
            data shape or dtype, labels out of ``0..9``, or a length mismatch); the message
            names the file.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = write_fake_cifar10(tmp, n_train_per_batch=2, n_test=3)
        ...     images, labels = load_cifar10_batches(tmp, ["test_batch"])["test_batch"]
        >>> images.shape, images.dtype, labels.shape, labels.dtype
        (torch.Size([3, 3, 32, 32]), torch.uint8, torch.Size([3]), torch.int64)
    """
    folder = resolve_cifar10_dir(data_dir)
    names = list(_REQUIRED_FILES if names is None else names)
    unknown = [name for name in names if name not in _REQUIRED_FILES]
    if unknown:
        raise ValueError(f"unknown CIFAR-10 batch names {unknown}; expected some of {list(_REQUIRED_FILES)}")
    return {name: _read_batch(folder / name) for name in names}


def load_cifar10_classes(data_dir: str | os.PathLike[str]) -> tuple[str, ...]:
    """Class names from ``batches.meta``, or the standard CIFAR-10 names when it is absent.

    Args:
        data_dir: the folder that contains ``cifar-10-batches-py/``, or that folder itself.

    Raises:
        FileNotFoundError: the folder or one of the batch files is missing.
        ValueError: ``batches.meta`` exists but has no list of 10 distinct names under
            ``b"label_names"``.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     _ = write_fake_cifar10(tmp, n_train_per_batch=1, n_test=1)
        ...     load_cifar10_classes(tmp)[:3]
        ('airplane', 'automobile', 'bird')
    """
    path = resolve_cifar10_dir(data_dir) / CIFAR10_META_FILE
    if not path.is_file():
        return CIFAR10_CLASSES
    record = _unpickle(path)
    names = _get(record, "label_names") if isinstance(record, dict) else None
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, (bytes, str)) for n in names):
        raise ValueError(f'{path}: expected a pickled dict with b"label_names" (a list of 10 names)')
    decoded = tuple(n.decode("utf-8") if isinstance(n, bytes) else n for n in names)
    if len(decoded) != len(CIFAR10_CLASSES) or len(set(decoded)) != len(decoded):
        raise ValueError(f"{path}: expected 10 distinct class names, found {list(decoded)}")
    return decoded


def write_fake_cifar10(
    root: str | os.PathLike[str],
    n_train_per_batch: int = 10,
    n_test: int = 10,
    seed: int = 0,
) -> Path:
    """Write a tiny CIFAR-10 folder in the real python format (for tests; no download).

    Creates ``root/cifar-10-batches-py/`` with ``data_batch_1`` .. ``data_batch_5``,
    ``test_batch`` and ``batches.meta``, pickled like the official files (protocol 2, dicts
    with ``b"batch_label"``, ``b"labels"``, ``b"data"``, ``b"filenames"``). Pixels are random
    uint8 values and labels random ints in ``0..9``, both drawn from ``seed``.

    Args:
        root: folder to write into (created if needed).
        n_train_per_batch: images in each of the five training batches.
        n_test: images in ``test_batch``.
        seed: seed of the pixel and label values.

    Returns:
        The ``cifar-10-batches-py`` folder written.

    Raises:
        TypeError: a count is not an int.
        ValueError: a count is negative.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     folder = write_fake_cifar10(tmp, n_train_per_batch=2, n_test=2)
        ...     print(*sorted(p.name for p in folder.iterdir()))
        batches.meta data_batch_1 data_batch_2 data_batch_3 data_batch_4 data_batch_5 test_batch
    """
    check_int("n_train_per_batch", n_train_per_batch, minimum=0)
    check_int("n_test", n_test, minimum=0)
    folder = Path(root) / CIFAR10_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    sizes = [(name, n_train_per_batch) for name in CIFAR10_TRAIN_FILES] + [(CIFAR10_TEST_FILE, n_test)]
    for index, (name, size) in enumerate(sizes):
        label = f"training batch {index + 1} of 5" if index < 5 else "testing batch 1 of 1"
        record = {
            b"batch_label": label.encode(),
            b"labels": [int(v) for v in rng.integers(0, len(CIFAR10_CLASSES), size)],
            b"data": rng.integers(0, 256, (size, _PIXELS), dtype=np.uint8),
            b"filenames": [f"fake_{name}_{i}.png".encode() for i in range(size)],
        }
        with (folder / name).open("wb") as handle:
            pickle.dump(record, handle, protocol=2)
    meta = {
        b"num_cases_per_batch": n_train_per_batch,
        b"label_names": [name.encode() for name in CIFAR10_CLASSES],
        b"num_vis": _PIXELS,
    }
    with (folder / CIFAR10_META_FILE).open("wb") as handle:
        pickle.dump(meta, handle, protocol=2)
    return folder
