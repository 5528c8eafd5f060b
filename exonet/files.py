"""Files exonet writes for the user: atomically, and into folders it makes on the way.

Every output (a trace, a run directory's JSON, a Chrome trace, a plot) is written under a
temporary name and renamed into place, so a crash never leaves half a file; a path in a folder
that does not exist yet gets that folder, as ``--chrome-trace out/run.json`` on a fresh checkout
expects.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO, Any, Iterator


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
    finally:
        tmp.unlink(missing_ok=True)
