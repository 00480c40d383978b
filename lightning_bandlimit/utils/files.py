"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "atomic_write_json"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, writer: Callable[[io.TextIOBase], None] | str | bytes) -> Path:
    """Write a file atomically: into a temporary file beside it, then ``os.replace``.

    Args:
        path: the destination (its folder must exist).
        writer: the text or bytes to write, or a function writing into a text stream.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        FileNotFoundError: if the destination's folder does not exist. The destination is
            untouched by any failure, and no temporary file is left behind.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     atomic_write(Path(folder) / "a.txt", "hello").read_text()
        'hello'
    """
    path = Path(path)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual permissions
        if isinstance(writer, bytes):
            with os.fdopen(handle, "wb") as stream:
                stream.write(writer)
        else:
            with os.fdopen(handle, "w", newline="" if callable(writer) else None, encoding="utf-8") as stream:
                if callable(writer):
                    writer(stream)
                else:
                    stream.write(writer)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | Path, value: Any, *, indent: int = 2, **dumps_kwargs: Any) -> Path:
    """Write ``value`` as JSON (with a final newline) atomically; see :func:`atomic_write`.

    Args:
        path: the destination.
        value: anything :func:`json.dumps` accepts with ``dumps_kwargs``.
        indent: JSON indentation.
        **dumps_kwargs: passed to :func:`json.dumps` (e.g. ``default=str``).

    Raises:
        TypeError: if ``value`` is not JSON-serialisable; nothing is written then.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     json.loads(atomic_write_json(Path(folder) / "a.json", {"a": 1}).read_text())
        {'a': 1}
    """
    text = json.dumps(value, indent=indent, **dumps_kwargs) + "\n"
    return atomic_write(path, text)
