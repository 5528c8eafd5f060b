"""Shared memory for the tensors and arrays a fit sends to its nodes: one copy for all K, parent included.

A dataset held in memory (a TensorDataset, tensors or numpy arrays in a user's Dataset)
would otherwise be copied into every node. Instead, while an object is pickled for the
nodes, every CPU tensor storage it holds is replaced by a handle to shared memory:

* a storage of at least ``BIG`` bytes is moved into shared memory in place (torch's
  ``share_memory_``: the parent's tensors now live there, no second copy is kept);
* smaller storages are copied, side by side, into one shared arena (a dataset of many
  small per-sample tensors costs one mapping and one extra copy, not K copies and not
  one file per sample);
* a numpy array of a dtype torch knows is copied once into shared memory (numpy memory
  cannot be moved in place) and rebuilt in the node as an array over those pages;
* a memory-mapped numpy array (np.memmap, ``np.load(mmap_mode="r")``) travels as its file,
  offset and shape: the node maps the same file, sharing its page cache, with no copy.

Handles name a file descriptor the parent holds, opened by the node through
``/proc/<parent>/fd/<n>``: nothing is passed per process, so one pickling serves all K
nodes and the number of shared storages is not bounded by the 256 descriptors a process
start can carry. The segments are unlinked files: they vanish with their last user, even
if the parent is killed. A node maps each segment once, however many objects refer to it.
"""

from __future__ import annotations

import mmap
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from exonet.units import format_bytes

BIG = 1 << 20  # storages from this size up are shared in place, smaller ones go to the arena
ALIGN = 64  # arena offsets, so every dtype's elements stay aligned
SHM = "/dev/shm"  # where torch's shared memory lives on Linux
MapMode = Literal["r", "r+"]  # how a node maps a shared file (``w+`` reopens ``r+``: never truncated)


@dataclass(frozen=True)
class Segment:
    """A shared-memory file held open by process ``pid`` as descriptor ``fd``."""

    pid: int
    fd: int
    nbytes: int


def _segment(storage: torch.UntypedStorage) -> Segment:
    fd, nbytes = storage._share_fd_cpu_()
    return Segment(os.getpid(), fd, nbytes)


def _new_shared(nbytes: int) -> torch.UntypedStorage:
    try:
        return torch.UntypedStorage._new_shared(nbytes)
    except RuntimeError as exc:
        raise _no_room(nbytes, exc) from None


def _no_room(nbytes: int, exc: Exception) -> RuntimeError:
    """Shared memory could not be had: how much was asked, what /dev/shm has, and what to do instead."""
    try:
        info = os.statvfs(SHM)
        free = f"{format_bytes(info.f_bavail * info.f_frsize, binary=True)} free"
    except OSError:
        free = "absent"
    return RuntimeError(f"fit: cannot place {format_bytes(nbytes, binary=True)} of the datasets in shared memory "
                        f"({SHM}: {free}; {exc}). Enlarge {SHM} (e.g. docker run --shm-size=...), or pass a dataset "
                        "factory f(rank, num_nodes, train) so that each node builds its own shard")


def _shared_copy(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    copy = _new_shared(storage.nbytes())
    copy.copy_(storage)
    return copy


@dataclass
class Shipment:
    """The parent's side: hands out handles while objects are pickled, keeps the shared memory alive.

    Keep the shipment until every node has unpickled what it was sent (the descriptors are
    opened then). Several objects pickled with one shipment share its storages and arrays.
    """

    keep: list[Any] = field(default_factory=list)
    _handles: dict[tuple[int, int], tuple] = field(default_factory=dict)
    arenas: list[Segment] = field(default_factory=list)
    _pieces: list[torch.UntypedStorage] = field(default_factory=list)
    _arena_bytes: int = 0
    _arrays: dict[int, torch.Tensor] = field(default_factory=dict)

    def persistent_id(self, obj: Any) -> tuple | None:
        """The handle that replaces a CPU storage in the pickle stream (None: pickle ``obj`` as usual)."""
        if isinstance(obj, torch.TypedStorage):
            untyped, dtype = obj._untyped_storage, obj.dtype
        elif isinstance(obj, torch.UntypedStorage):
            untyped, dtype = obj, None
        else:
            return None
        if untyped.device.type != "cpu" or untyped.nbytes() == 0:
            return None
        key = (untyped.data_ptr(), untyped.nbytes())
        if key not in self._handles:
            self._handles[key] = self._share(untyped)
        return (*self._handles[key], dtype)

    def _share(self, untyped: torch.UntypedStorage) -> tuple:
        self.keep.append(untyped)  # the data pointer is this handle's key: it must not be reused meanwhile
        if untyped.nbytes() < BIG:
            offset = -(-self._arena_bytes // ALIGN) * ALIGN
            self._pieces.append(untyped)
            self._arena_bytes = offset + untyped.nbytes()
            return ("arena", len(self.arenas), offset, untyped.nbytes())
        try:
            return ("segment", _segment(untyped))
        except RuntimeError:  # cannot be moved (already shared by file name, or no room): share a copy
            copy = _shared_copy(untyped)
            self.keep.append(copy)
            return ("segment", _segment(copy))

    def reduce_array(self, arr: np.ndarray) -> tuple | None:
        """How ``arr`` travels: by its file if it is a memory map, else by shared memory (None: as usual)."""
        view = file_view(arr)
        if view is not None:
            return rebuild_memmap, view
        tensor = self.array(arr)
        return None if tensor is None else (rebuild_array, (tensor, bool(arr.flags.writeable)))

    def array(self, arr: np.ndarray) -> torch.Tensor | None:
        """A tensor holding ``arr``'s values whose storage will travel shared (None when torch cannot hold it).

        Arrays from ``BIG`` bytes up are copied into shared memory now, once per shipment; smaller
        ones are copied into the arena with the small storages.
        """
        if arr.dtype.hasobject or arr.nbytes == 0:
            return None
        if id(arr) not in self._arrays:
            try:
                with warnings.catch_warnings():  # a read-only array: its tensor is only read, to copy it
                    warnings.simplefilter("ignore", UserWarning)
                    tensor = torch.from_numpy(np.ascontiguousarray(arr))
            except (TypeError, ValueError):  # a dtype torch lacks, a non-native byte order
                return None
            if tensor.nbytes >= BIG:
                # (torch's stub wants a stride; without one torch lays the view out contiguous, as the copy is)
                tensor = torch.empty(0, dtype=tensor.dtype).set_(  # type: ignore[call-overload]
                    _shared_copy(tensor.untyped_storage()), 0, tensor.shape)
            self.keep += [arr, tensor]  # the array's id is the cache key; the tensor's memory is read at seal()
            self._arrays[id(arr)] = tensor
        return self._arrays[id(arr)]

    def seal(self) -> tuple[Segment, ...]:
        """Copy the storages met since the last seal into a new shared arena; returns every arena so far.

        Call it after each pickling: the stream's handles name arenas by their index here.
        """
        if self._pieces:
            arena = _new_shared(self._arena_bytes)
            offset = 0
            for piece in self._pieces:
                offset = -(-offset // ALIGN) * ALIGN
                arena[offset : offset + piece.nbytes()].copy_(piece)
                offset += piece.nbytes()
            self.keep.append(arena)
            self.arenas.append(_segment(arena))
            self._pieces, self._arena_bytes = [], 0
        return tuple(self.arenas)


_mapped: dict[tuple[int, int], torch.UntypedStorage] = {}  # this process's mappings by file (device, inode)


def attach(segment: Segment) -> torch.UntypedStorage:
    """The node's side: map a parent's segment (once per process, however often it is named)."""
    path = f"/proc/{segment.pid}/fd/{segment.fd}"
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        raise RuntimeError(f"exonet: this node cannot open the parent's shared memory {path} "
                           f"({type(exc).__name__}: {exc}); nodes must run as the parent's user with /proc "
                           f"mounted") from None
    try:
        info = os.fstat(fd)
        key = (info.st_dev, info.st_ino)
        if key not in _mapped:
            _mapped[key] = torch.UntypedStorage._new_shared_fd_cpu(  # type: ignore[attr-defined]  # private, unstubbed
                fd, segment.nbytes)
        return _mapped[key]
    finally:
        os.close(fd)


class Resolver:
    """Turns the handles of one pickle stream back into storages over the parent's shared memory."""

    def __init__(self, arenas: tuple[Segment, ...]) -> None:
        self.arenas = arenas
        self._slices: dict[tuple[int, int], torch.UntypedStorage] = {}  # one storage per piece, as in the parent

    def __call__(self, handle: tuple) -> Any:
        kind, dtype = handle[0], handle[-1]
        if kind == "segment":
            untyped = attach(handle[1])
        elif kind == "arena":
            index, offset, nbytes = handle[1:4]
            if (index, offset) not in self._slices:
                self._slices[index, offset] = attach(self.arenas[index])[offset : offset + nbytes]
            untyped = self._slices[index, offset]
        else:
            raise RuntimeError(f"exonet: unknown shared-memory handle {handle!r}")
        return untyped if dtype is None else torch.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)


def file_view(arr: np.ndarray) -> tuple[str, int, str, tuple[int, ...], MapMode] | None:
    """Where a memory-mapped array's bytes lie in its file: (path, offset, dtype, shape, mode), or None.

    A C-contiguous np.memmap opened "r", "r+" or "w+" qualifies: its pages are the file's page
    cache, so a node that maps the file shares them (no copy at all). A copy-on-write map ("c")
    may differ from its file, so it travels as any array does.
    """
    mm = getattr(arr, "_mmap", None)
    if (not isinstance(arr, np.memmap) or mm is None or arr.filename is None or arr.mode not in ("r", "r+", "w+")
            or not arr.flags.c_contiguous or arr.nbytes == 0):
        return None
    begins = arr.offset - arr.offset % mmap.ALLOCATIONGRANULARITY  # where numpy's map starts in the file
    at = begins + arr.ctypes.data - np.frombuffer(mm, np.uint8).ctypes.data
    return str(arr.filename), at, arr.dtype.str, arr.shape, "r" if arr.mode == "r" else "r+"


def rebuild_memmap(path: str, offset: int, dtype: str, shape: tuple[int, ...], mode: MapMode) -> np.memmap:
    """The node's map of the same bytes of the same file (``w+`` is reopened ``r+``: never truncated)."""
    return np.memmap(path, dtype=np.dtype(dtype), mode=mode, offset=offset, shape=shape)


def rebuild_array(tensor: torch.Tensor, writeable: bool) -> np.ndarray:
    """A numpy array over a shared tensor's pages (the tensor stays alive as the array's base)."""
    arr = tensor.numpy()
    if not writeable:
        arr.flags.writeable = False
    return arr
