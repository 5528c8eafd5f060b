"""The object store a fit's nodes share (``comm.put`` / ``comm.get``): a directory, or an S3 bucket.

By default it is a directory on this machine (``DirectoryStore``): each key one file holding a tensor's raw
bytes, written under a temporary name and renamed, so a reader never sees half an object; the parent makes
it and removes it when the fit ends. ``fit(object_store="s3://bucket/prefix")`` puts the objects in a bucket
instead (``BucketStore``, through exonet's one S3 client, ``exonet.data.store``: its retries, its AWS
environment), under a prefix of the fit's own, which is how nodes on several hosts (torchrun) meet. A get
waits for its key, up to fit's ``timeout_s``, then names the key and the rank. Keys are relative paths of
letters, digits and ``._-/`` (``round3/rank2``): never absolute, never ``..``.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path
from typing import Callable

import torch

KEY = re.compile(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*")
POLL_S = (0.0005, 0.02)  # a get's first and longest pause between looks for its key


def check_key(key: object, rank: int) -> str:
    """``key`` if it names an object inside the store, else a ValueError naming it and the rank."""
    if not isinstance(key, str) or not KEY.fullmatch(key) or any(part in (".", "..") for part in key.split("/")):
        raise ValueError(f"comm.put/get on rank {rank}: key {key!r} must be a relative path of letters, digits and "
                         "'._-/' (such as 'round3/rank2'), without '.' or '..' parts")
    if len(key) > 1024:
        raise ValueError(f"comm.put/get on rank {rank}: key {key[:40]!r}... is longer than 1024 characters")
    return key


class DirectoryStore:
    """Objects as files under ``root``, shared by the nodes of one fit.

    Args:
        root: the store's directory (it exists).
        rank: the node using it, for error messages.
        timeout_s: how long a get waits for its key.
    """

    def __init__(self, root: str | os.PathLike[str], rank: int, timeout_s: float) -> None:
        self.root, self.rank, self.timeout_s = Path(root), rank, timeout_s

    def put(self, key: str, tensor: torch.Tensor) -> None:
        path = self.root / check_key(key, self.rank)
        if path.exists():
            raise ValueError(f"comm.put on rank {self.rank}: key {key!r} is already in the store; a key is written "
                             "once (put each round under its own key)")
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        data = _bytes(tensor)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise OSError(exc.errno, f"comm.put on rank {self.rank}: cannot write key {key!r} to the store "
                                     f"{self.root}: {exc.strerror}") from exc

    def ready(self, key: str) -> bool:
        return (self.root / check_key(key, self.rank)).exists()

    def get(self, key: str, out: torch.Tensor) -> torch.Tensor:
        """Fill ``out`` with the object ``key`` once it is there (its bytes must be ``out``'s size)."""
        path = self.root / check_key(key, self.rank)
        data = _poll(lambda: path.read_bytes() if path.exists() else None, key, self.rank, self.timeout_s, POLL_S)
        return _fill(out, data, key, self.rank)


class BucketStore:
    """Objects under an ``s3://bucket/prefix`` every node of the fit reaches (a moto server, MinIO, S3).

    Args:
        url: the fit's own prefix (the parent adds one per fit to the URL given).
        rank: the node using it, for error messages.
        timeout_s: how long a get waits for its key.
    """

    def __init__(self, url: str, rank: int, timeout_s: float) -> None:
        from exonet.data.store import S3Store

        self.bucket, self.rank, self.timeout_s = S3Store(url), rank, timeout_s

    def put(self, key: str, tensor: torch.Tensor) -> None:
        self.bucket.write(check_key(key, self.rank), _bytes(tensor))

    def ready(self, key: str) -> bool:
        try:
            self.bucket.client().head_object(Bucket=self.bucket.bucket, Key=self.bucket.key(check_key(key, self.rank)))
        except Exception:  # noqa: BLE001 - absent (404) or unreachable: not ready; get() says which
            return False
        return True

    def get(self, key: str, out: torch.Tensor) -> torch.Tensor:
        """Fill ``out`` with the object ``key`` once it is there (a request per look, so looks are sparser)."""
        name = check_key(key, self.rank)

        def look() -> bytes | None:
            try:
                return self.bucket.read(name)
            except FileNotFoundError:
                return None

        data = _poll(look, key, self.rank, self.timeout_s, (POLL_S[0] * 20, POLL_S[1] * 10), f" in {self.bucket.url}")
        return _fill(out, data, key, self.rank)


def _bytes(tensor: torch.Tensor) -> bytes:
    """A tensor's raw bytes, as an object holds them."""
    return tensor.detach().contiguous().cpu().view(torch.uint8).reshape(-1).numpy().tobytes()


def _poll(look: Callable[[], bytes | None], key: str, rank: int, timeout_s: float, pauses: tuple[float, float],
          where: str = "") -> bytes:
    """What ``look()`` returns once it returns something, looking again after pauses that double from
    ``pauses[0]`` to ``pauses[1]``; after ``timeout_s`` a TimeoutError naming the key and the rank."""
    deadline, pause = time.monotonic() + timeout_s, pauses[0]
    while (data := look()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"comm.get on rank {rank}: key {key!r} was never put{where} (waited {timeout_s:g} s, "
                               "fit's timeout_s)")
        time.sleep(pause)
        pause = min(pauses[1], pause * 2)
    return data


def _fill(out: torch.Tensor, data: bytes, key: str, rank: int) -> torch.Tensor:
    """``out`` filled with the object's bytes, which must be its size."""
    if len(data) != out.nbytes:
        raise ValueError(f"comm.get on rank {rank}: key {key!r} holds {len(data)} bytes, but the tensor to fill "
                         f"takes {out.nbytes}")
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return out.copy_(flat.view(out.dtype).reshape(out.shape).to(out.device))


def open_objects(location: str, rank: int, timeout_s: float) -> DirectoryStore | BucketStore:
    """The store at ``location``: an ``s3://`` URL, or a directory."""
    if location.startswith("s3://"):
        return BucketStore(location, rank, timeout_s)
    return DirectoryStore(location, rank, timeout_s)
