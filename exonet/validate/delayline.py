"""A user-space delay line: K network namespaces joined through TUN devices by a process that holds each packet.

These kernels have no ``netem``, so delay cannot be shaped in the kernel. Each node namespace gets
one TUN device as its NIC (``<p>t<i>``, address ``netns.address(i)``/16, MTU 1500, so its whole
subnet routes through it); one forwarder process (``serve``, run as ``python -m
exonet.validate.delayline``) holds the other end of every TUN device. It reads each IP packet a
namespace sends, keeps it ``delay`` seconds in a FIFO (one delay for every packet, so due times are
in arrival order and a deque is the heap) and writes it into the TUN device of the namespace that
owns its destination address: a star whose every path is ``delay`` one way, RTT = 2·delay.

Shaping stays in the kernel: a ``tbf`` on a node's TUN device (its egress, before the delay line
reads the packet) is the node's uplink, with the queue tbf's ``latency`` gives. A TUN device counts
IP packets, no Ethernet header: a 1500-byte packet carries 1448 bytes of TCP payload with
timestamps, so ``header_bytes`` is 52 here (66 on the veth testbed).

Life cycle, as ``netns.Network``: everything is named ``exv<pid>-...``; the TUN devices exist only
while the forwarder holds them, and the forwarder exits when its parent's pipe on its stdin closes,
so a parent killed hard leaves no forwarder and no TUN device; namespaces a killed run left are
removed by the next run (``netns.remove_leftovers``).
"""

from __future__ import annotations

import collections
import fcntl
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from exonet.validate.netns import Namespaces, Shaper, _sh, address

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
TX_QUEUE = 10000  # packets a TUN device queues for the forwarder (the default 500 drops bursts at 1 Gbit/s)


def open_tun(name: str) -> int:
    """A non-blocking fd for a new TUN device ``name`` (IP packets, no header); the device lives while it is open."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def serve(names: Sequence[str], addresses: Sequence[str], delay: float) -> None:
    """Forward every packet read from one TUN device into the one owning its destination, ``delay`` s later.

    Prints ``up`` once the devices exist and runs until stdin closes (the parent's end of the pipe); then
    prints its counters as JSON (``DelayLine.stats``): packets forwarded, dropped (the receiving stack
    refused them), unroutable (no device owns the address), and how late packets left (p50, p99, max
    seconds past their due time), which says whether the line kept its delay.
    """
    fds = [open_tun(name) for name in names]
    route = {bytes(int(x) for x in a.split(".")): fd for a, fd in zip(addresses, fds)}
    try:  # steadier timing on a loaded machine; said in the counters either way
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        policy = "SCHED_FIFO"
    except OSError:
        policy = "SCHED_OTHER"
    poll = select.epoll()
    for fd in fds:
        poll.register(fd, select.EPOLLIN)
    stdin = sys.stdin.fileno()
    poll.register(stdin, select.EPOLLIN)
    print("up", flush=True)
    held: collections.deque[tuple[float, int, bytes]] = collections.deque()
    clock = time.monotonic
    counts = dict.fromkeys(("forwarded", "dropped", "unroutable"), 0)
    late: list[float] = []  # one sample per wake-up that forwarded something: the oldest packet's lateness
    while True:
        timeout = max(0.0, held[0][0] - clock()) if held else -1
        events = poll.poll(timeout)
        now = clock()
        for fd, _ in events:
            if fd == stdin:
                if not os.read(stdin, 4096):
                    _report(counts, late, policy)
                    return
                continue
            due = now + delay
            while True:
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                out = route.get(packet[16:20])
                if out is None:
                    counts["unroutable"] += 1
                else:
                    held.append((due, out, packet))
        if held and held[0][0] <= now:
            late.append(now - held[0][0])
        while held and held[0][0] <= now:
            _, out, packet = held.popleft()
            try:
                os.write(out, packet)
                counts["forwarded"] += 1
            except OSError:  # the receiving stack's backlog is full: a drop, as on a wire
                counts["dropped"] += 1


def _report(counts: dict[str, int], late: list[float], policy: str) -> None:
    """Print the forwarder's counters as one JSON line (``serve``); nobody reads them if the parent was killed."""
    late.sort()
    q = [late[min(len(late) - 1, int(f * len(late)))] if late else 0.0 for f in (0.5, 0.99, 1.0)]
    try:
        print(json.dumps({**counts, "late_p50_s": q[0], "late_p99_s": q[1], "late_max_s": q[2], "policy": policy}),
              flush=True)
    except BrokenPipeError:  # the parent is gone: keep Python's exit flush from raising again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@dataclass(frozen=True)
class DelayLink:
    """Every node's NIC: ``rate`` bytes/s shaped by ``shaper`` on its egress (None: unshaped), ``delay`` s one way."""

    delay: float
    rate: float | None = None
    shaper: Shaper = Shaper(latency=0.2)  # a deep queue: the delay line's cases are about windows, not loss
    congestion: str | None = None  # net.ipv4.tcp_congestion_control in each namespace (None: the host's)


class DelayLine(Namespaces):
    """K namespaces joined by the delay line; a context manager that always tears down (``netns.Namespaces``)."""

    def __init__(self, k: int, link: DelayLink) -> None:
        super().__init__()
        self.k, self.link = k, link
        self.forwarder: subprocess.Popen | None = None
        self.stats: dict[str, Any] = {}  # the forwarder's counters, once closed (``serve``)
        self._made: list[str] = []

    def iface(self, rank: int) -> str:
        return f"{self.prefix}t{rank}"

    def close(self) -> None:
        """Stop the forwarder (its TUN devices go with it), then delete the namespaces; safe to call twice."""
        if self.forwarder is not None:
            proc, self.forwarder = self.forwarder, None
            if proc.poll() is None:
                proc.stdin.close()  # type: ignore[union-attr]
                try:
                    self.stats = json.loads(proc.stdout.readline() or "{}")  # type: ignore[union-attr]
                    proc.wait(5)
                except (subprocess.TimeoutExpired, ValueError):
                    proc.kill()
                    proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]
        while self._made:
            _sh("ip", "netns", "del", self._made.pop(), check=False)
        super().close()

    def _build(self) -> None:
        names = [self.iface(r) for r in range(self.k)]
        self.forwarder = subprocess.Popen(
            [sys.executable, "-m", "exonet.validate.delayline", "serve", f"{self.link.delay!r}", *names],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.forwarder.stdout.readline().strip()  # type: ignore[union-attr]
        if line != "up":
            raise RuntimeError(f"delay line: the forwarder did not start (it said {line!r}, "
                               f"exit code {self.forwarder.poll()})")
        for rank, tun in enumerate(names):
            ns = self.netns(rank)
            _sh("ip", "netns", "add", ns)
            self._made.append(ns)
            _sh("ip", "link", "set", tun, "netns", ns)
            inside = ("ip", "netns", "exec", ns)
            _sh(*inside, "ip", "addr", "add", f"{address(rank)}/16", "dev", tun)
            _sh(*inside, "ip", "link", "set", tun, "txqueuelen", str(TX_QUEUE), "up")
            _sh(*inside, "ip", "link", "set", "lo", "up")
            if self.link.congestion:
                _sh(*inside, "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={self.link.congestion}")
            if self.link.rate is not None:
                s = self.link.shaper
                _sh(*inside, "tc", "qdisc", "replace", "dev", tun, "root", "tbf", "rate",
                    f"{int(self.link.rate * 8)}bit", "burst", str(s.burst), "latency", f"{s.latency * 1e3:g}ms")

    def sysctls(self, rank: int = 0) -> dict[str, str]:
        """The TCP buffer and congestion settings a socket in ``rank``'s namespace gets (``SOCKET_SYSCTLS``)."""
        out = _sh(*self.exec_prefix(rank), "sysctl", *SOCKET_SYSCTLS).stdout
        return {k.strip(): " ".join(v.split()) for k, _, v in (line.partition("=") for line in out.splitlines())}


RATE_HEADER = ("| one-way delay ms | tbf Mbit/s | streams | goodput Mbit/s | p99 late ms | max late ms | dropped "
               "| forwarder CPU | load |\n|---|---|---|---|---|---|---|---|---|")


@dataclass
class LineRate:
    """One bulk transfer through the delay line: what the receiver got, and whether the line kept its delay."""

    delay: float
    shaped: float | None  # the tbf rate on the sender's egress, bytes/s
    streams: int
    goodput: float  # bit/s of TCP payload at the receiver, after the warm-up
    stats: dict[str, Any]  # the forwarder's counters (``serve``)
    cpu: float  # the forwarder's CPU time over the transfer, in cores
    load: float  # the machine's 1-minute load average after it

    def row(self) -> str:
        shaped = f"{self.shaped * 8 / 1e6:g}" if self.shaped else "unshaped"
        return (f"| {self.delay * 1e3:g} | {shaped} | {self.streams} | {self.goodput / 1e6:.0f} | "
                f"{float(self.stats['late_p99_s']) * 1e3:.2f} | {float(self.stats['late_max_s']) * 1e3:.1f} | "
                f"{self.stats['dropped']} | {self.cpu:.0%} | {self.load:.1f} |")


def line_rate(delay: float, shaped: float | None, streams: int = 16, seconds: float = 6.0,
              warmup: float = 2.0, port: int = 29800) -> LineRate:
    """Send zeros from rank 0 to rank 1 over ``streams`` connections for ``seconds`` and time what arrives.

    ``python -m exonet.validate --matrix delay`` prints these as the delay line's rate table.
    """
    me = [sys.executable, "-m", "exonet.validate.delayline"]
    with DelayLine(2, DelayLink(delay, shaped)) as net:
        sink = subprocess.Popen([*net.exec_prefix(1), *me, "sink", str(port), str(streams), str(warmup)],
                                stdout=subprocess.PIPE, text=True)
        before = _cpu_seconds(net.forwarder.pid)  # type: ignore[union-attr]
        subprocess.run([*net.exec_prefix(0), *me, "send", str(port), str(streams), str(seconds)], check=True)
        cpu = (_cpu_seconds(net.forwarder.pid) - before) / seconds  # type: ignore[union-attr]
        goodput = float(sink.communicate(timeout=60)[0])
    return LineRate(delay, shaped, streams, goodput, net.stats, cpu, os.getloadavg()[0])


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# What decides one TCP stream's window and its restart after idle (read inside a namespace: most are per namespace).
SOCKET_SYSCTLS = ("net.core.wmem_max", "net.core.rmem_max", "net.ipv4.tcp_wmem", "net.ipv4.tcp_rmem",
                  "net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_congestion_control")


def _sink(port: int, streams: int, warmup: float) -> None:
    """Accept ``streams`` connections and read them to their end; print the goodput after ``warmup`` s in bit/s."""
    server = socket.create_server((address(1), port), backlog=streams)
    conns = [server.accept()[0] for _ in range(streams)]
    poll = select.epoll()
    for c in conns:
        c.setblocking(False)
        poll.register(c.fileno(), select.EPOLLIN)
    by_fd = {c.fileno(): c for c in conns}
    start = time.monotonic()
    counted, first, last, open_ = 0, None, start, len(conns)
    buf = bytearray(1 << 20)
    while open_:
        for fd, _ in poll.poll():
            try:
                n = by_fd[fd].recv_into(buf)
            except BlockingIOError:
                continue
            if n == 0:
                poll.unregister(fd)
                open_ -= 1
                continue
            now = time.monotonic()
            if now - start >= warmup:
                first = now if first is None else first
                counted += n
                last = now
    print(counted * 8 / (last - first) if first is not None and last > first else 0.0, flush=True)


def _send(port: int, streams: int, seconds: float) -> None:
    """``streams`` connections to rank 1 sending zeros for ``seconds``."""
    conns = []
    for _ in range(streams):
        for _ in range(100):
            try:
                conns.append(socket.create_connection((address(1), port)))
                break
            except OSError:
                time.sleep(0.05)
    block = bytes(1 << 16)
    end = time.monotonic() + seconds

    def pump(c: socket.socket) -> None:
        while time.monotonic() < end:
            c.sendall(block)
        c.close()

    threads = [threading.Thread(target=pump, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "serve":
        serve(args[1:], [address(r) for r in range(len(args) - 1)], float(args[0]))
    elif mode == "sink":
        _sink(int(args[0]), int(args[1]), float(args[2]))
    else:
        _send(int(args[0]), int(args[1]), float(args[2]))
