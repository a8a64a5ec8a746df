"""Where a command writes: an output the file system would refuse is refused before any work (packing a model
takes minutes), with what is wrong with it; ``cli.main`` words any other file-system error the same way."""

from __future__ import annotations

import tempfile
from pathlib import Path

from .errors import UsageError


def check_writable(path: Path, folder: bool = False, hint: str | None = None) -> None:
    """Refuse ``path`` (a file to write, or with ``folder`` a folder to fill) when it cannot be written: a file's
    path that is a folder, a folder's that is a file, a file on the way to it, or a place that takes no new file
    (permissions, a read-only file system, ``/proc``)."""
    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        raise UsageError(f"{path} is a file, not a folder", hint=hint)
    if not folder and path.is_dir():
        raise UsageError(f"{path} is a folder: give the file to write", hint=hint)
    nearest = path if folder else path.parent
    while not nearest.exists():  # the folders still to make go under the nearest one that exists
        nearest = nearest.parent
    if not nearest.is_dir():
        raise UsageError(f"cannot write {path}: {nearest} is a file, not a folder", hint=hint)
    try:
        with tempfile.TemporaryFile(dir=nearest):
            pass
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {nearest} takes no new file ({exc.strerror})", hint=hint) from None


def describe(exc: OSError) -> str:
    """An ``OSError`` as one line: the path(s) it names and the system's reason."""
    paths = " -> ".join(str(name) for name in (exc.filename, exc.filename2) if name is not None)
    return f"{paths}: {exc.strerror}" if paths and exc.strerror else str(exc)
