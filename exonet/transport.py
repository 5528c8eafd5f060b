"""How a fit's objects travel from the parent to its node processes, from wherever fit was called.

Nodes are forked from a forkserver that has torch preloaded (fast start-up). Plain
multiprocessing would make every node re-import the caller's ``__main__``: impossible
in a notebook, under ``python -c`` or a script on stdin (there is no file), and a
re-run of the whole study in a script without a main guard. So nodes never import
``__main__``: the model, datasets, collate functions and strategies travel by value
with cloudpickle (classes and functions defined in ``__main__`` are pickled with their
code; importable ones by reference, as usual). Tensors inside datasets still go through
torch's shared-memory reducers, so a large in-memory dataset is shared, not copied K
times. The model travels as torch.save bytes instead, so each node owns its parameters.

What cannot travel (an open file, a lock, a socket) fails in the parent with the path to
the object inside the argument, e.g. ``train_dataset.handle``, and the reason.
"""

from __future__ import annotations

import io
import os
import pickle
import threading
from collections import ChainMap
from multiprocessing import popen_forkserver, spawn
from multiprocessing.context import ForkServerProcess
from multiprocessing.reduction import ForkingPickler
from typing import Any

import cloudpickle
import torch

MAIN_KEYS = ("init_main_from_name", "init_main_from_path")
MODULE_SLOTS = ("_modules", "_parameters", "_buffers")
HINT = ("Open files, locks, sockets and threads cannot be copied to another process: open them inside the "
        "node instead (lazily, e.g. on first __getitem__, or in a dataset factory f(rank, num_nodes, train))")


class NodePickler(cloudpickle.Pickler):
    """cloudpickle (``__main__`` by value) with torch's shared-memory tensor reducers.

    The C pickler reads ``dispatch_table`` when it is created, so it is a class attribute;
    the ChainMap sees reducers that torch.multiprocessing registers later.
    """

    dispatch_table = ChainMap(ForkingPickler._extra_reducers, cloudpickle.Pickler.dispatch_table)


class ByValue:
    """Pickles ``obj`` with NodePickler inside the process start (so tensors' shared memory goes along).

    With ``environ=True`` the node also takes this process's environment as it is now, as a
    spawned process would: the forkserver's own is a snapshot from the first fit, so a
    variable set since (``AWS_ENDPOINT_URL`` in a notebook cell) would otherwise be missed.
    """

    def __init__(self, obj: Any, environ: bool = False) -> None:
        self.obj, self.environ = obj, environ

    def __reduce__(self) -> tuple[Any, tuple[bytes, dict[str, str] | None]]:
        buf = io.BytesIO()
        NodePickler(buf).dump(self.obj)
        return _load, (buf.getvalue(), dict(os.environ) if self.environ else None)


def _load(data: bytes, environ: dict[str, str] | None) -> Any:
    if environ is not None:
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update(environ)
    return pickle.loads(data)


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
                super()._launch(process_obj)
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

