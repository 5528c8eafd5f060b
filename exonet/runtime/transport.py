"""How a fit's objects travel from the parent to its node processes, from wherever fit was called.

Nodes are forked from a forkserver that has torch preloaded (fast start-up). Plain
multiprocessing would make every node re-import the caller's ``__main__``: impossible
in a notebook, under ``python -c`` or a script on stdin (there is no file), and a
re-run of the whole study in a script without a main guard. So nodes never import
``__main__``: the model, datasets, collate functions and strategies travel by value
with cloudpickle (classes and functions defined in ``__main__`` are pickled with their
code; importable ones by reference, as usual). The datasets are pickled once for all K
nodes, their tensors and numpy arrays replaced by handles to shared memory
(exonet.data.shared), so an in-memory dataset exists once, not K times. The model, the
strategy and the configuration travel by value instead, so each node owns its state.

What cannot travel (an open file, a lock, a socket) fails in the parent with the path to
the object inside the argument, e.g. ``train_dataset.handle``, and the reason.
"""

from __future__ import annotations

import io
import os
import pickle
import threading
import types
from multiprocessing import popen_forkserver, spawn
from multiprocessing.context import ForkServerProcess
from typing import Any

import cloudpickle
import numpy as np
import torch

from exonet.data.shared import Resolver, Segment, Shipment

MAIN_KEYS = ("init_main_from_name", "init_main_from_path")
MODULE_SLOTS = ("_modules", "_parameters", "_buffers")
HINT = ("Open files, locks, sockets and threads cannot be copied to another process: open them inside the "
        "node instead (lazily, e.g. on first __getitem__, or in a dataset factory f(rank, num_nodes, train))")


class NodePickler(cloudpickle.Pickler):
    """cloudpickle (``__main__`` by value); with a shipment, CPU storages and numpy arrays go to shared memory."""

    def __init__(self, file: io.BytesIO, shipment: Shipment | None = None) -> None:
        super().__init__(file)
        self.shipment = shipment

    def persistent_id(self, obj: Any) -> tuple | None:
        return None if self.shipment is None else self.shipment.persistent_id(obj)

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.CodeType:  # cloudpickle names by-value code "<dynamic-code>": keep the user's file
            reduced = cloudpickle.cloudpickle._code_reduce(obj)
            return reduced[0], tuple(obj.co_filename if a == "<dynamic-code>" else a for a in reduced[1])
        if self.shipment is not None and isinstance(obj, np.ndarray):
            reduced = self.shipment.reduce_array(obj)
            if reduced is not None:
                return reduced
        return super().reducer_override(obj)


class ByValue:
    """Pickles ``obj`` with NodePickler when the first node starts; every later node gets the same bytes.

    With a ``shipment`` its tensors and arrays travel in shared memory (the shipment must outlive the
    nodes' start). With ``environ=True`` the node also takes this process's environment as it is now,
    as a spawned process would: the forkserver's own is a snapshot from when it started (``warm_up()`` or
    the first fit), so a
    variable set since (``AWS_ENDPOINT_URL`` in a notebook cell) would otherwise be missed.
    """

    def __init__(self, obj: Any, environ: bool = False, shipment: Shipment | None = None) -> None:
        self.obj, self.environ, self.shipment = obj, environ, shipment
        self._pickled: tuple[bytes, tuple[Segment, ...] | None] | None = None

    def pickle_now(self) -> tuple[bytes, tuple[Segment, ...] | None]:
        """Pickle ``obj`` now (placing its shared memory), if not yet: its bytes and shared arenas."""
        if self._pickled is None:
            buf = io.BytesIO()
            NodePickler(buf, self.shipment).dump(self.obj)
            self._pickled = (buf.getvalue(), None if self.shipment is None else self.shipment.seal())
        return self._pickled

    def __reduce__(self) -> tuple[Any, tuple]:
        return _load, (*self.pickle_now(), dict(os.environ) if self.environ else None)


def shared_by_value(*datasets: Any) -> tuple[ByValue, ...]:
    """The datasets ready to send to every node, their memory shared through one shipment (which they hold)."""
    shipment = Shipment()
    return tuple(ByValue(d, shipment=shipment) for d in datasets)


def shared_bytes(data: bytes) -> Any:
    """``data`` for every node, placed in shared memory now: one copy, and a node's start stays small.

    When /dev/shm has no room (a container's default is 64 MB) the bytes themselves are
    returned, and each node's start carries its own copy, as it did before.
    """
    sent = ByValue(np.frombuffer(data, dtype=np.uint8), shipment=Shipment())
    try:
        sent.pickle_now()  # the shared copy is made here, not when the first node starts
    except RuntimeError:
        return data
    return sent


class Unloadable:
    """Stands in for an argument a node could not unpickle (its class's module does not import there).

    Unpickling happens as the process starts, before the node can report anything; raising there
    would leave only "exited with code 1" and a traceback on stderr. ``node_main`` raises ``error``
    inside its report instead (exonet.runtime.node).
    """

    def __init__(self, error: str) -> None:
        self.error = error


def _load(data: bytes, arenas: tuple[Segment, ...] | None, environ: dict[str, str] | None) -> Any:
    if environ is not None:
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update(environ)
    try:
        if arenas is None:
            return pickle.loads(data)
        unpickler = pickle.Unpickler(io.BytesIO(data))
        unpickler.persistent_load = Resolver(arenas)  # type: ignore[method-assign] # pickle's documented hook
        return unpickler.load()
    except (ImportError, AttributeError) as exc:
        module = f"module {exc.name!r}" if isinstance(exc, ImportError) and exc.name else "a class"
        return Unloadable(f"the node process cannot import {module} ({type(exc).__name__}: {exc}); the parent "
                          "pickled it by reference: make it importable in the node (an installed package, or a "
                          "folder on sys.path / PYTHONPATH when fit starts), or define it in the script itself")


_PREPARING = threading.Lock()


class _Popen(popen_forkserver.Popen):
    """A forkserver start whose child never imports ``__main__`` (its arguments carry their own code).

    The preparation data the child applies names the main module to import; it is dropped
    here (under a lock, as multiprocessing reads it through a module attribute).
    """

    def _launch(self, process_obj: Any) -> None:
        real = spawn.get_preparation_data

        def without_main(name: str) -> dict[str, Any]:
            data = real(name)
            for key in MAIN_KEYS:
                data.pop(key, None)
            return data

        with _PREPARING:
            spawn.get_preparation_data = without_main
            try:
                super()._launch(process_obj)  # type: ignore[misc] # private: typeshed does not list it
            finally:
                spawn.get_preparation_data = real


class NodeProcess(ForkServerProcess):
    """A forkserver process that does not import ``__main__``; pass its arguments wrapped in ByValue."""

    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:  # noqa: N802 - multiprocessing's name
        return _Popen(process_obj)


def pickle_model(model: torch.nn.Module) -> bytes:
    """The model as torch.save bytes, its classes by value when they live in ``__main__``."""
    buf = io.BytesIO()
    try:
        torch.save(model, buf, pickle_module=cloudpickle)
    except Exception as exc:  # noqa: BLE001 - pickling can fail in many ways
        raise TypeError(f"fit: {untravelled({'model': model}) or f'the model cannot be pickled ({exc})'}. "
                        f"{HINT}.") from None
    return buf.getvalue()


def untravelled(objects: dict[str, Any]) -> str | None:
    """Name the innermost object that cannot be pickled and why, e.g. ``train_dataset.lock (_thread.lock) ...``."""
    for name, obj in objects.items():
        found = _find(name, obj, set())
        if found is not None:
            return found
    return None


def _find(path: str, obj: Any, seen: set[int]) -> str | None:
    if id(obj) in seen:
        return None
    seen.add(id(obj))
    try:
        cloudpickle.dumps(obj)
        return None
    except Exception as exc:  # noqa: BLE001 - the failure is the user's to see
        reason = f"{type(exc).__name__}: {exc}"
    for child_path, child in _children(path, obj):
        deeper = _find(child_path, child, seen)
        if deeper is not None:
            return deeper
    return f"{path} ({type(obj).__module__}.{type(obj).__qualname__}) cannot be pickled ({reason})"


def _children(path: str, obj: Any) -> list[tuple[str, Any]]:
    if isinstance(obj, dict):
        return [(f"{path}[{k!r}]", v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
    state = getattr(obj, "__dict__", None)
    if not isinstance(state, dict):
        return []
    out = []
    for key, value in state.items():
        if key in MODULE_SLOTS and isinstance(value, dict):  # an nn.Module's submodules read as attributes
            out += [(f"{path}.{name}", v) for name, v in value.items()]
        else:
            out.append((f"{path}.{key}", value))
    return out


def check_picklable(objects: dict[str, Any]) -> None:
    """Raise TypeError naming what cannot travel to the nodes (called once a start failed)."""
    what = untravelled(objects)
    if what is not None:
        raise TypeError(f"fit: {what}. {HINT}.")

