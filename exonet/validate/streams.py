"""A ring all-reduce over N parallel TCP streams per neighbour pair, as NCCL's socket transport moves data.

NCCL's socket transport (src/transport/net_socket.cc) opens ``NCCL_NSOCKS_PERTHREAD`` sockets on
each of ``NCCL_SOCKET_NTHREADS`` helper threads per peer connection and cuts every request it
posts into pieces of max(64 KiB, size / sockets), handed to the sockets round-robin; its ring
all-reduce posts a step's chunk in slices and forwards a slice as soon as it has arrived (and
been reduced), so ring steps overlap. This program does the same with one thread per socket:

* ``slice_bytes > 0`` (NCCL): each ring step's chunk S/K is cut into slices of that size, each
  slice into pieces round-robin over the sockets; slice m of step j leaves once slice m of step
  j − 1 has arrived from the left neighbour.
* ``slice_bytes = 0`` (gloo, and the model's unpipelined phases): a step's whole chunk is cut into
  one piece per socket, and the next step starts once every piece of this one has arrived.

``streams = 1`` is gloo's one connection per pair. Only the bytes move: the reduction is
arithmetic on a few MB, which the shaped links at tens of Mbit/s make negligible.

``exonet.validate.slowlinks`` runs one per node namespace (``cases.launch_nodes``: rank, K and port from
the environment) on a job of ``streams``, ``nbytes``, ``repeats``, ``slice_bytes`` and ``count``; a repeat is
``count`` all-reduces back to back (each blocking, as per-tensor all-reduces are). Each node pickles the
wall seconds of each repeat (``time.perf_counter``, between barriers).
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import threading
import time
from pathlib import Path

from exonet.validate.netns import address


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n


def _connect(rank: int, k: int, streams: int, port: int) -> tuple[list[socket.socket], list[socket.socket]]:
    """``streams`` sockets to the right neighbour and from the left one."""
    server = socket.create_server((address(rank), port), backlog=streams)
    right = []
    deadline = time.monotonic() + 30
    for _ in range(streams):
        while True:
            try:
                s = socket.create_connection((address((rank + 1) % k), port), timeout=30)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        right.append(s)
    left = []
    for _ in range(streams):
        s, _ = server.accept()
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        left.append(s)
    server.close()
    for s in right + left:
        s.settimeout(None)
    return right, left


MIN_PIECE = 64 * 1024  # NCCL's smallest piece of a request per socket


def _pieces(total: int, n: int) -> list[int]:
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


def schedule(chunk: int, steps: int, streams: int, slice_bytes: int) -> list[list[tuple[int, int, int]]]:
    """Per socket, the (step, slice, bytes) pieces it carries in order; both ends of a pair compute the same."""
    if slice_bytes <= 0:  # one piece per socket per step
        return [[(j, 0, size) for j in range(steps)] for size in _pieces(chunk, streams)]
    per_socket: list[list[tuple[int, int, int]]] = [[] for _ in range(streams)]
    turn = 0
    for j in range(steps):
        for m, size in enumerate(_pieces(chunk, max(1, -(-chunk // slice_bytes)))):
            count = max(1, min(streams, size // MIN_PIECE))
            for piece in _pieces(size, count):
                per_socket[turn % streams].append((j, m, piece))
                turn += 1
    return per_socket


def ring_all_reduce(right: list[socket.socket], left: list[socket.socket], k: int, nbytes: int,
                    slice_bytes: int = 0) -> None:
    """2(K−1) ring steps of nbytes/K each over the sockets (see the module docstring for the two schedules)."""
    steps, chunk = 2 * (k - 1), max(1, nbytes // k)
    plan = schedule(chunk, steps, len(right), slice_bytes)
    pending: dict[tuple[int, int], int] = {}
    for pieces in plan:
        for j, m, _ in pieces:
            pending[j, m] = pending.get((j, m), 0) + 1
    arrived = {key: threading.Event() for key in pending}
    lock = threading.Lock()
    pipelined = slice_bytes > 0

    def send(sock: socket.socket, pieces: list[tuple[int, int, int]]) -> None:
        for j, m, size in pieces:
            if j:  # a slice goes on once the previous step's same slice (unpipelined: the whole step) is in
                for key in ([(j - 1, m)] if pipelined else [x for x in pending if x[0] == j - 1]):
                    arrived[key].wait()
            sock.sendall(bytes(size))

    def receive(sock: socket.socket, pieces: list[tuple[int, int, int]]) -> None:
        for j, m, size in pieces:
            _recv_exact(sock, memoryview(bytearray(size)))
            with lock:
                pending[j, m] -= 1
                if not pending[j, m]:
                    arrived[j, m].set()

    threads = [threading.Thread(target=send, args=(s, p)) for s, p in zip(right, plan)]
    threads += [threading.Thread(target=receive, args=(s, p)) for s, p in zip(left, plan)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _barrier(right: list[socket.socket], left: list[socket.socket]) -> None:
    """Two laps of one byte round the ring: every rank has entered once both have passed."""
    one = bytearray(1)
    for _ in range(2):
        right[0].sendall(b"b")
        _recv_exact(left[0], memoryview(one))


def main(spec: dict[str, int], out: Path) -> None:
    """One node of a case (``cases.launch_nodes`` runs it): its rank, K and port from the environment."""
    rank, k, port = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["MASTER_PORT"])
    right, left = _connect(rank, k, spec["streams"], port)
    times = []
    for _ in range(spec["repeats"]):
        _barrier(right, left)
        t0 = time.perf_counter()
        for _ in range(spec["count"]):
            ring_all_reduce(right, left, k, spec["nbytes"], spec["slice_bytes"])
        times.append(time.perf_counter() - t0)
    _barrier(right, left)
    (out / f"rank{rank}.pkl").write_bytes(pickle.dumps({"times": times}))


if __name__ == "__main__":
    main(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
