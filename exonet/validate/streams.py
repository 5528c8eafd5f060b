"""A ring all-reduce over N parallel TCP streams per neighbour pair, as NCCL's socket transport moves data.

NCCL's socket transport (src/transport/net_socket.cc) opens ``NCCL_NSOCKS_PERTHREAD`` sockets on
each of ``NCCL_SOCKET_NTHREADS`` helper threads per peer connection and splits every chunk it
posts into equal pieces, one per socket, each sent whole on its socket; the ring moves a chunk
to the next rank once the previous chunk has arrived. This program does the same with one
thread per socket: ring step j of the 2(K−1) steps sends the chunk S/K to the right neighbour,
cut into ``streams`` pieces sent at once, and waits for the piece of every socket from the left
neighbour. ``streams=1`` is gloo's one connection per pair. Only the bytes are moved: the
reduction is arithmetic on a few MB, which the shaped links at tens of Mbit/s make negligible.

Run one per node namespace: ``python -m exonet.validate.streams RANK K STREAMS BYTES REPEATS PORT``;
it prints one JSON line: the wall seconds of each repeat (``time.perf_counter``, between barriers).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

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


def _pieces(total: int, n: int) -> list[int]:
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


def ring_all_reduce(right: list[socket.socket], left: list[socket.socket], k: int, nbytes: int) -> None:
    """2(K−1) ring steps of nbytes/K each, every step's chunk split evenly over the sockets."""
    sizes = _pieces(max(1, nbytes // k), len(right))
    out = [bytearray(n) for n in sizes]
    inbox = [bytearray(n) for n in sizes]
    for _ in range(2 * (k - 1)):
        threads = [threading.Thread(target=s.sendall, args=(buf,)) for s, buf in zip(right, out)]
        threads += [threading.Thread(target=_recv_exact, args=(s, memoryview(buf))) for s, buf in zip(left, inbox)]
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


def main(argv: list[str]) -> None:
    rank, k, streams, nbytes, repeats, port = map(int, argv)
    right, left = _connect(rank, k, streams, port)
    times = []
    for _ in range(repeats):
        _barrier(right, left)
        t0 = time.perf_counter()
        ring_all_reduce(right, left, k, nbytes)
        times.append(time.perf_counter() - t0)
    _barrier(right, left)
    print(json.dumps({"rank": rank, "times": times}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
