"""The server that forks the node processes: one per Python process, with torch preloaded.

Nodes are forked from it rather than spawned, so a node starts without importing torch
again. Its imports happen once, before it forks the first node; ``warm_up`` starts it early.
This module imports nothing heavy, so ``exonet.warm_up()`` can run before torch is imported
and the server's imports run beside the caller's own.

The parent imports lazily too: a fit imports the runtime, and torch imports ``torch._dynamo`` (and
sympy with it) when the parent builds its first optimizer (an estimate's meta run; ``OptimSpec``'s
check does not). Ctrl-C in the middle of such an import leaves half a package in ``sys.modules``,
and every later fit of the process failed with an unrelated error (``module 'sympy' has no
attribute 'printing'``). ``complete_imports`` imports them whole: Ctrl-C waits for the import (a
second or two, once per process), then interrupts.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
from multiprocessing import forkserver
from multiprocessing.context import ForkServerContext

from exonet.runtime.signals import deferred

# torch._dynamo: every optimizer imports it (about 70 MB and a second of CPU); preloaded, all nodes share it
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "cloudpickle", "exonet.runtime.node"]
# What the parent imports lazily on its way to the nodes: fit itself.
PARENT_IMPORTS = ("exonet.runtime.run", "tqdm.auto")


def complete_imports(names: tuple[str, ...] = PARENT_IMPORTS) -> None:
    """Import ``names`` now, whole: a Ctrl-C that comes meanwhile is raised once they are done."""
    missing = [name for name in names if name not in sys.modules]
    if missing:
        with deferred():
            for name in missing:
                importlib.import_module(name)


def context() -> ForkServerContext:
    """The multiprocessing context that starts nodes (its server preloads ``PRELOAD``)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def warm_up() -> None:
    """Start the server that forks the nodes now, so that the first fit of this process starts warm.

    Before it forks its first node, the server imports torch and ``torch._dynamo`` once (about
    3 s of CPU), which the first fit otherwise waits for. Called early (the top of a script, a
    notebook's first cell) the import runs beside the caller's own set-up: its imports, data and
    model. Every fit uses the same server: calling this twice, or never, is fine.
    """
    context()
    forkserver.ensure_running()


def warm_up_by_default() -> None:
    """``warm_up()`` where a fit is coming and it is safe: ``exonet.LocalTrainer`` (or ``Trainer``) is asked for, in
    the main process (not a node, not the server), not under torchrun (whose nodes fork from nothing here), and
    ``EXONET_WARM_UP`` is not "0". The server's imports (about 1.7 s on 2 cores) then run beside the caller's own
    import of torch, before the first fit needs them (``python -m exonet.bench runtime --startup``)."""
    child = multiprocessing.parent_process() is not None
    unpickling = getattr(multiprocessing.current_process(), "_inheriting", False)  # a node still starting: its
    if child or unpickling or os.environ.get("EXONET_WARM_UP", "1") == "0" or "TORCHELASTIC_RUN_ID" in os.environ:
        return  # strategy's module may import LocalTrainer while multiprocessing forbids starting processes
    with deferred():  # a Ctrl-C meanwhile lands once the server is started whole
        warm_up()
