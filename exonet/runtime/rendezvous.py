"""A local run's rendezvous: a TCP store that only this machine can reach, and gloo kept on loopback.

torch's TCPStore server binds every interface (``::``) whatever host it is given, so a store
opened for "127.0.0.1" answered other hosts too: they could read and write the run's keys. Here
the parent binds the listening socket to 127.0.0.1 itself and hands it to the store
(``master_listen_fd``), which serves on that socket and closes it with the store; the port is
still the kernel's choice, so concurrent runs never collide. Nodes connect as clients and pin
gloo's own connections to the loopback interface (``GLOO_SOCKET_IFNAME``), unless the user chose
an interface. A torchrun launch keeps torchrun's store (exonet.runtime.torchrun).
"""

from __future__ import annotations

import os
import socket
import sys
from datetime import timedelta
from typing import NoReturn

import torch.distributed as dist

LOOPBACK = "127.0.0.1"


def loopback_store(world: int, timeout_s: float = 60.0) -> dist.TCPStore:
    """The server of a run's rendezvous, listening on 127.0.0.1 only, on a free port (``store.port``).

    Args:
        world: how many ranks will join.
        timeout_s: how long a call on the store waits.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((LOOPBACK, 0))
        listener.listen(max(128, world))
        port = listener.getsockname()[1]
    except BaseException:
        listener.close()
        raise
    # From here the store owns the socket: it serves on it and closes it when it goes, or when its construction
    # fails. An interrupt (Ctrl-C) inside the constructor had the store close it and then this function close it
    # again: EBADF replaced the KeyboardInterrupt, or a close could hit another file that reused the number.
    fd = listener.detach()
    return dist.TCPStore(LOOPBACK, port, world, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s), master_listen_fd=fd)


def join_store(port: int, world: int, timeout_s: float = 60.0) -> dist.TCPStore:
    """A node's client of ``loopback_store`` on ``port``, with gloo kept on the loopback interface."""
    keep_gloo_on_loopback()
    return dist.TCPStore(LOOPBACK, port, world, is_master=False, timeout=timedelta(seconds=timeout_s))


def keep_gloo_on_loopback() -> None:
    """Make gloo listen and connect on the loopback interface (``lo`` on Linux, ``lo0`` on macOS).

    Without it gloo uses the address the host name resolves to, which may face the network. A
    ``GLOO_SOCKET_IFNAME`` the user set is kept.
    """
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    names = [name for _, name in socket.if_nameindex()]
    loopback = [n for n in ("lo", "lo0") if n in names] + [n for n in names if n.startswith("lo")]
    if loopback:
        os.environ["GLOO_SOCKET_IFNAME"] = loopback[0]


def leave_without_teardown() -> NoReturn:
    """End a measuring node whose results are already written, skipping gloo's teardown.

    After every rank has finished its work, gloo's teardown (``destroy_process_group`` or the interpreter's
    exit) can still abort the process on a loaded machine ("terminate called without an active exception",
    SIGABRT), which would fail a measurement that is complete. Call it after a barrier and after the results
    are out: a file written, or put on a multiprocessing ``SimpleQueue`` (which writes before it returns).
    exonet's own nodes tear down, and their runtime ignores a crash once a node has delivered.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
