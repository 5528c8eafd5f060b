"""The server that forks the node processes: one per Python process, with torch preloaded.

Nodes are forked from it rather than spawned, so a node starts without importing torch
again. Its imports happen once, before it forks the first node; ``warm_up`` starts it early.
This module imports nothing heavy, so ``exonet.warm_up()`` can run before torch is imported
and the server's imports run beside the caller's own.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing import forkserver
from multiprocessing.context import ForkServerContext

# torch._dynamo: every optimizer imports it (about 70 MB and a second of CPU); preloaded, all nodes share it
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "cloudpickle", "exonet.runtime.node"]


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
