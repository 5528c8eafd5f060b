"""S3Dataset: a sharded dataset read lazily, shard by shard, through a bounded local cache.

Used as ``fit``'s train dataset it splits itself by whole blocks of samples (node r reads
samples ``[r·m, (r+1)·m)``, m = N // K), so each node downloads only the shards its
block touches: disjoint shards when m is a multiple of the shard size, otherwise one
boundary shard shared by two neighbours. Within its block a node shuffles per epoch
(seeded), as with any dataset factory; so give ``cache_bytes`` room for a node's share, or
shards are fetched more than once per epoch (``fit(shuffle=False)`` streams shard by shard
through any cache; the parent warns when a share does not fit). As a validation dataset it
is read from the start.

Each process (node, DataLoader worker) keeps its own cache: a private temporary folder,
removed when the process is done with the dataset. Shards are evicted least recently used
once the cache passes ``cache_bytes``; a shard is memory-mapped, not loaded, so memory
stays bounded by the cache, not the dataset.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import warnings
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch.utils.data import Dataset

from exonet.data.shards import INDEX, OpenShard, parse_index
from exonet.data.store import LocalStore, open_store
from exonet.units import format_bytes, parse_size


class S3Dataset(Dataset):
    """Samples written by ``write_shards``, from ``s3://bucket/prefix``, ``file:///path`` or a folder.

    Args:
        url: where ``write_shards`` wrote the dataset.
        cache_bytes: how much each process keeps on local disk (and mapped): a size such as "1 GiB" or
            bytes. At least one shard is always kept.
        cache_dir: the folder to cache in (default: a private temporary folder per process, removed after).
        retries: transient S3 failures retried this many times, with exponential backoff.
        **s3_options: ``endpoint_url``, ``region``, ``aws_access_key_id``, ``aws_secret_access_key``,
            ``aws_session_token``, ``backoff_s`` (default: the standard AWS environment).
    """

    def __init__(self, url: str | os.PathLike, *, cache_bytes: int | str = "1 GiB", cache_dir: str | None = None,
                 retries: int = 5, **s3_options: Any) -> None:
        on_s3 = urlparse(os.fspath(url)).scheme == "s3"
        self.store = open_store(url, retries=retries, **s3_options) if on_s3 else open_store(url, **s3_options)
        self.index = parse_index(self.store.read(INDEX), f"{self.store.url}/{INDEX}")
        self.cache_bytes = (cache_bytes if isinstance(cache_bytes, int)
                            else int(parse_size(cache_bytes, "S3Dataset: cache_bytes")))
        if isinstance(cache_bytes, bool) or self.cache_bytes < 0:
            raise ValueError(f"S3Dataset: cache_bytes must be a size >= 0, got {cache_bytes!r}")
        self.cache_dir = cache_dir
        self.start, self.stop = 0, self.index["num_samples"]
        self.fetched: list[int] = []  # shards this process downloaded (or mapped), in order: for tests and logs
        self._open: OrderedDict[int, OpenShard] = OrderedDict()
        self._folder: Path | None = None
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        # Shards, maps and the cache folder belong to one process; another one opens its own.
        return {**self.__dict__, "_open": OrderedDict(), "_folder": None, "fetched": [], "_pid": None}

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i: int) -> Any:
        if not -len(self) <= i < len(self):
            raise IndexError(f"S3Dataset: index {i} out of range for {len(self)} samples")
        g = self.start + (i % len(self))
        size = self.index["shard_size"]
        return self._pack(self._shard(g // size).row(g % size))

    def node_split(self, rank: int, num_nodes: int, train: bool = True) -> "S3Dataset":
        """This node's block of samples (``fit`` uses it as the dataset factory of a train dataset)."""
        m = len(self) // num_nodes
        part = copy.copy(self)
        part.__dict__.update(self.__getstate__())
        part.start, part.stop = self.start + rank * m, self.start + (rank + 1) * m
        share = sum(self.index["shards"][s]["bytes"] for s in part.shards_of())
        if self._pid == os.getpid() and rank == 0 and share > self.cache_bytes:  # once, in the parent
            warnings.warn(f"S3Dataset: each node's share of {self.store.url} is {format_bytes(share)}, more than "
                          f"cache_bytes ({format_bytes(self.cache_bytes)}): shuffled, shards are fetched more than "
                          "once per epoch; raise cache_bytes or use fit(shuffle=False)", stacklevel=2)
        return part

    def shards_of(self) -> list[int]:
        """The shards this dataset's samples lie in."""
        size = self.index["shard_size"]
        return list(range(self.start // size, (self.stop - 1) // size + 1)) if len(self) else []

    # ------------------------------------------------------------- internals
    def _pack(self, tensors: list[torch.Tensor]) -> Any:
        kind = self.index["structure"]
        if kind == "tensor":
            return tensors[0]
        if kind == "dict":
            return {f["name"]: t for f, t in zip(self.index["fields"], tensors)}
        return tuple(tensors)

    def _shard(self, s: int) -> OpenShard:
        if self._pid != os.getpid():  # a forked DataLoader worker: its own cache, not the parent's
            self.__dict__.update(self.__getstate__(), _pid=os.getpid())
        shard = self._open.get(s)
        if shard is not None:
            self._open.move_to_end(s)
            return shard
        entry = self.index["shards"][s]
        self._evict(entry["bytes"])
        if isinstance(self.store, LocalStore):
            path = self.store.path(entry["file"])
            if not path.exists():
                raise FileNotFoundError(f"{path}: listed in {self.store.url}/{INDEX} but missing")
        else:
            path = self.store.download(entry["file"], self._cache_folder(), entry["bytes"])
        self._open[s] = shard = OpenShard(path, entry, self.index["fields"])
        self.fetched.append(s)
        return shard

    def _evict(self, incoming: int) -> None:
        """Drop least recently used shards until ``incoming`` more bytes fit (keeping none if need be).

        Only a file directly inside this process's cache folder is deleted (a folder store's shards are
        the user's own files, and nothing an index names can point elsewhere).
        """
        while self._open and sum(o.nbytes for o in self._open.values()) + incoming > self.cache_bytes:
            _, shard = self._open.popitem(last=False)
            if self._folder is not None and shard.path.parent == self._folder:
                shard.path.unlink(missing_ok=True)

    def _cache_folder(self) -> Path:
        if self._folder is None:
            if self.cache_dir is not None:
                Path(self.cache_dir).mkdir(parents=True, exist_ok=True)
            self._folder = Path(tempfile.mkdtemp(prefix="exonet-shards-", dir=self.cache_dir))
            weakref.finalize(self, shutil.rmtree, str(self._folder), True)
        return self._folder

    def __repr__(self) -> str:
        return f"S3Dataset({self.store.url!r}, samples {self.start}..{self.stop} of {self.index['num_samples']})"
