"""Files exonet writes for the user: atomically, and into folders it makes on the way.

Every output (a trace, a run directory's JSON, a Chrome trace, a plot) is written under a
temporary name and renamed into place, so a crash never leaves half a file; a path in a folder
that does not exist yet gets that folder, as ``--chrome-trace out/run.json`` on a fresh checkout
expects. A name read from a file exonet did not necessarily write (a checkpoint pointer, a
shard in an index) passes ``plain_name`` first, so it cannot lead out of its folder.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO, Any, Iterator


def plain_name(name: object, where: str, error: type[Exception] = ValueError) -> str:
    """``name`` if it is a plain file or folder name, one level inside the folder it is read for.

    Anything else raises ``error`` naming ``where`` (the file and entry it came from): not a string,
    empty, "." or "..", a separator (``/`` or ``\\``, on every system), a drive, or a NUL byte.
    """
    if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name
            or os.path.isabs(name) or name[1:2] == ":"):
        raise error(f"{where}: {name!r} is not a plain name inside its folder (no separators, '..', absolute "
                    "paths or drives)")
    return name


def check_output(path: str | os.PathLike, where: str, *, folder: bool = False) -> Path:
    """``path`` as a Path, once it is clear that a file (``folder``: a folder) can be made there.

    Checked before the work whose result goes there, so a path that cannot be written is named at
    once and not after a replay: ValueError naming ``where`` (the flag or argument) when the path is
    a folder where a file must go (or a file where a folder must), when a file stands where one of
    its folders must be, or when the nearest existing folder cannot be written.
    """
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        raise ValueError(f"{where}: {path} is a {'file' if folder else 'folder'}; give a "
                         f"{'folder' if folder else 'file'} path")
    for parent in [path, *path.parents] if folder else path.parents:  # nearest first: the first that exists decides
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{where}: cannot write {path}: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ValueError(f"{where}: cannot write {path}: the folder {parent} is not writable")
            break
    return path


def output_path(path: str | os.PathLike) -> Path:
    """``path`` as a Path whose folder exists (made with its parents when missing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO[Any]]:
    """Write ``path`` through a temporary file renamed into place (``mode`` "wb" or "w", UTF-8)."""
    path = output_path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # a full disk names no file ("[Errno 28] No space left on device"): name ours
        if exc.errno is None or exc.filename not in (None, tmp, str(tmp)):
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    finally:
        tmp.unlink(missing_ok=True)
