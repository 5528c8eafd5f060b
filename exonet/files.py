"""Files exonet writes for the user: atomically, and into folders it makes on the way.

Every output (a trace, a run directory's JSON, a Chrome trace, a plot) is written under a
temporary name and renamed into place, so a crash never leaves half a file; a path in a folder
that does not exist yet gets that folder, as ``--chrome-trace out/run.json`` on a fresh checkout
expects. A name read from a file exonet did not necessarily write (a checkpoint pointer, a
shard in an index) passes ``plain_name`` first, so it cannot lead out of its folder.

Nothing is written through a link someone else planted: a temporary file is created new
(``O_CREAT | O_EXCL | O_NOFOLLOW``) under an unpredictable name, it is renamed only over a
regular file (or none), and a file opened in place (``open_regular``) is opened with
``O_NOFOLLOW`` and must be a regular file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
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


TEMP_MARK = ".tmp-"  # a temporary file is ".<name>.tmp-<random>" beside the file it becomes
NOT_REGULAR = "not a regular file (a symbolic link, a folder or a device): exonet replaces only regular files"


def temp_name(name: str) -> bool:
    """Whether ``name`` is one of ``atomic_file``'s temporary files (left behind when a process was killed)."""
    return name.startswith(".") and TEMP_MARK in name


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new, empty temporary file beside ``path``: created exclusively, never through a link, under a name that
    cannot be guessed (a predictable one lets a planted link redirect the write). An error names ``path``, the
    file the user asked for, not the temporary name ("/proc/.x.json.tmp-…") they never gave."""
    while True:
        tmp = path.with_name(f".{path.name}{TEMP_MARK}{secrets.token_hex(8)}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666), tmp
        except FileExistsError:
            continue
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc


def _replace_regular(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` to ``path`` when ``path`` is a regular file or absent; else FileExistsError naming it."""
    try:
        held = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(held.st_mode):
            raise FileExistsError(errno.EEXIST, NOT_REGULAR, str(path))
    os.replace(tmp, path)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb", *, newline: str | None = None) -> Iterator[IO[Any]]:
    """Write ``path`` through a temporary file renamed into place (``mode`` "wb" or "w", UTF-8; ``newline`` as
    ``open``'s). A ``path`` that is a link, a folder or a device is refused (FileExistsError naming it)."""
    path = output_path(path)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8", newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        _replace_regular(tmp, path)
    except OSError as exc:  # a full disk names no file ("[Errno 28] No space left on device"): name ours
        if exc.errno is None or exc.filename not in (None, tmp, str(tmp)):
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    finally:
        tmp.unlink(missing_ok=True)


def open_regular(path: Path, flags: int, error: type[Exception] = OSError, *, follow: bool = False) -> int:
    """A descriptor of ``path`` opened with ``flags``, once it is clear that it is a regular file.

    Without ``follow`` a link is refused (``O_NOFOLLOW``), so that a write cannot land where a planted
    link points; a FIFO or a device is refused too (opened with ``O_NONBLOCK``, so that opening one
    cannot hang). Refusals raise ``error`` naming ``path``; a missing file raises FileNotFoundError.
    """
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW), 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise error(f"{path}: is a symbolic link; exonet opens a run directory's own files, never a link "
                        "(replace the link with the file itself)") from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO without a reader, a folder
            raise error(f"{path}: {NOT_REGULAR}") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise error(f"{path}: {NOT_REGULAR}")
    return fd


def read_regular(path: Path, error: type[Exception]) -> bytes:
    """The bytes of ``path`` (a link is followed), refused with ``error`` naming it unless it is a regular file:
    a FIFO, a device or ``/dev/zero`` would hang or never end."""
    fd = open_regular(path, os.O_RDONLY, error, follow=True)
    with os.fdopen(fd, "rb") as f:
        return f.read()
