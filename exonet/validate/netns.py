"""A real network on one machine: one Linux network namespace per node, shaped by the kernel.

Layout (root namespace holds the bridges, each node namespace one interface)::

    node i:  netns <p>n<i>, interface <p>e<i> (10.77.0.<i+1>/16)  ──veth──  <p>h<i> ∈ bridge <p>b<region>
    regions: bridges <p>b0 and <p>b1 joined by the veth pair <p>la ─ <p>lb

Shaping: a node's uplink is an ``htb`` on its own interface (egress); its downlink, when
it differs from the uplink, an ``htb`` on an ``ifb`` that the interface's ingress is
redirected to (the usual ingress-shaping idiom). The inter-region link is an ``htb`` on
each end of the joining veth pair, one per direction, so every flow crossing it in one
direction shares one queue, which is the scenario's ``[[links]]`` semantics.

Names carry a per-run prefix ``exv<pid in hex>-`` (15-character interface limit), so two runs
never collide and a leftover of a crashed run names the process that made it:
``leftovers()`` lists the objects whose process is gone, ``remove_leftovers()`` deletes
them. ``Network`` tears everything down on exit, on Ctrl-C, on SIGTERM and, for a hard
crash, at the next run's start.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence, TypeVar

PREFIX = "exv"
SUBNET = "10.77"
_NAME = re.compile(rf"^{PREFIX}([0-9a-f]+)-")


class NetnsUnavailable(RuntimeError):
    """This process cannot create network namespaces (not root, or no kernel support)."""


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def privilege() -> str | None:
    """None when namespaces can be made here (tried, not guessed from the uid); else why not, in one line."""
    name = f"{PREFIX}{os.getpid():x}-probe"
    try:
        proc = _sh("ip", "netns", "add", name, check=False)
    except FileNotFoundError:
        return "exonet validate needs the `ip` tool (iproute2), which is not installed"
    if proc.returncode:
        return ("exonet validate needs to create network namespaces (run as root): "
                f"{proc.stderr.strip() or 'ip netns add failed'}")
    _sh("ip", "netns", "del", name, check=False)
    for tool in ("tc",):
        if _sh("sh", "-c", f"command -v {tool}", check=False).returncode:
            return f"exonet validate needs the `{tool}` tool (iproute2)"
    return None


def _shape(dev: str, rate_Bps: float, netns: str | None = None) -> None:
    """Shape ``dev``'s egress to ``rate_Bps`` bytes/s (htb counts every byte of each L2 frame).

    One htb class at the rate, split in two: small packets (IP length < 128: pure ACKs)
    go first, bulk data after. With one FIFO, the ACKs of the flow coming in would queue
    behind up to a second of outgoing data, starving it: a shaper artefact (a NIC's queue
    is shallow), not the network the model describes, where the two directions are independent.
    """
    bits = f"{int(rate_Bps * 8)}bit"
    # Two frames, or 1 ms at rate: a deeper bucket lets a burst of small messages out at veth speed, which
    # a NIC's line rate never does (htb's timers are fine-grained enough for this to hold the rate).
    burst = str(max(2 * 1514, int(rate_Bps * 0.001)))
    pre = ("ip", "netns", "exec", netns) if netns else ()
    tc = (*pre, "tc")
    _sh(*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "20")
    _sh(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", bits, "ceil", bits,
        "burst", burst, "cburst", burst)
    for cls, share, prio in (("1:10", 0.05, "0"), ("1:20", 0.95, "1")):
        _sh(*tc, "class", "add", "dev", dev, "parent", "1:1", "classid", cls, "htb", "rate",
            f"{int(rate_Bps * 8 * share)}bit", "ceil", bits, "burst", burst, "cburst", burst, "prio", prio)
    _sh(*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32",
        "match", "u16", "0x0000", "0xff80", "at", "2", "flowid", "1:10")


@dataclass(frozen=True)
class Shaper:
    """A shaper set up the way people shape real hosts: one FIFO, ACKs behind the data, a bounded queue.

    ``kind`` "tbf": ``tc qdisc ... root tbf rate R burst B latency L`` (the queue holds R·L + B bytes);
    "htb": one htb class at R with a ``pfifo limit`` of R·L + B bytes' worth of packets under it.
    ``both``: shape the downlink (an ifb on ingress) the same way, not only egress. The kernel's
    TCP settings stay at their defaults, as on a real host.
    """

    kind: str = "tbf"
    burst: int = 32768  # bytes
    latency: float = 0.05  # seconds of queue at the rate
    both: bool = False

    def limit(self, rate_Bps: float) -> int:
        """The queue's bytes: what tbf computes from ``latency`` (rate · latency + burst)."""
        return int(rate_Bps * self.latency) + self.burst


def _shape_real(dev: str, rate_Bps: float, shaper: Shaper, netns: str) -> None:
    """Shape ``dev``'s egress with ``shaper`` (every packet, ACKs included, in one FIFO)."""
    tc = ("ip", "netns", "exec", netns, "tc")
    bits = f"{int(rate_Bps * 8)}bit"
    if shaper.kind == "tbf":
        _sh(*tc, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", bits, "burst", str(shaper.burst),
            "latency", f"{shaper.latency * 1000:g}ms")
        return
    if shaper.kind != "htb":
        raise ValueError(f"Shaper.kind: expected 'tbf' or 'htb', got {shaper.kind!r}")
    _sh(*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
    _sh(*tc, "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", bits, "ceil", bits,
        "burst", str(shaper.burst), "cburst", str(shaper.burst))
    _sh(*tc, "qdisc", "add", "dev", dev, "parent", "1:1", "bfifo", "limit", str(shaper.limit(rate_Bps)))


def qdisc_drops(netns: str) -> int:
    """Packets the qdiscs in ``netns`` have dropped so far (``tc -s qdisc``)."""
    text = _sh("ip", "netns", "exec", netns, "tc", "-s", "qdisc", "show", check=False).stdout
    return sum(int(m) for m in re.findall(r"dropped (\d+)", text))


def _mib(text: str, prefix: str) -> dict[str, int]:
    """A ``/proc/net/snmp``-style table's counters for one protocol (a header line, then a value line)."""
    rows = [line.split() for line in text.splitlines() if line.startswith(prefix)]
    return {k: int(v) for k, v in zip(rows[0][1:], rows[1][1:])} if len(rows) >= 2 else {}


def retransmissions(netns: str) -> int:
    """TCP segments retransmitted in ``netns`` so far (``/proc/net/snmp``, Tcp RetransSegs)."""
    text = _sh("ip", "netns", "exec", netns, "cat", "/proc/net/snmp", check=False).stdout
    return _mib(text, "Tcp:").get("RetransSegs", 0)


# What each loss counter of a case counts, and where the kernel keeps it.
LOSS_COUNTERS = {
    "retransmits": "segments retransmitted (Tcp RetransSegs)",
    "timeouts": "retransmission timeouts (TcpExt TCPTimeouts)",
    "probes": "tail loss probes sent (TcpExt TCPLossProbes)",
    "drops": "packets the qdiscs dropped (tc -s qdisc)",
}


def loss_counters(netns: str) -> dict[str, int]:
    """``LOSS_COUNTERS`` in ``netns`` so far: each namespace has its own TCP MIBs and qdiscs."""
    ext = _mib(_sh("ip", "netns", "exec", netns, "cat", "/proc/net/netstat", check=False).stdout, "TcpExt:")
    return {"retransmits": retransmissions(netns), "timeouts": ext.get("TCPTimeouts", 0),
            "probes": ext.get("TCPLossProbes", 0), "drops": qdisc_drops(netns)}


def network_losses(net: "Network", k: int) -> dict[str, int]:
    """``loss_counters`` summed over the first ``k`` nodes of ``net``."""
    totals = dict.fromkeys(LOSS_COUNTERS, 0)
    for r in range(k):
        for name, value in loss_counters(net.netns(r)).items():
            totals[name] += value
    return totals


@dataclass(frozen=True)
class NodeLink:
    """One node's NIC in bytes/s (None = unshaped); ``shaper`` shapes it as a real host is (see Shaper)."""

    uplink: float | None
    downlink: float | None = None
    shaper: Shaper | None = None


def address(rank: int) -> str:
    return f"{SUBNET}.{rank // 250}.{rank % 250 + 1}"


_N = TypeVar("_N", bound="Namespaces")


class Namespaces(ABC):
    """Node namespaces named ``exv<pid>-n<rank>``, built on entry and always torn down: on exit, Ctrl-C,
    SIGTERM and a failed build (``_build`` and ``close``, the subclass's); a crashed run's leftovers go first."""

    def __init__(self) -> None:
        self.prefix = f"{PREFIX}{os.getpid():x}-"
        self._old_handlers: dict[int, object] = {}

    def netns(self, rank: int) -> str:
        return f"{self.prefix}n{rank}"

    @abstractmethod
    def iface(self, rank: int) -> str:
        """The interface ``rank``'s traffic leaves by (a veth end, or a TUN device)."""

    def exec_prefix(self, rank: int) -> list[str]:
        """The command prefix that runs a program inside ``rank``'s namespace."""
        return ["ip", "netns", "exec", self.netns(rank)]

    def __enter__(self: _N) -> _N:
        remove_leftovers()
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_signal(self, signum: int, frame: object) -> None:
        self.close()
        raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)

    @abstractmethod
    def _build(self) -> None:
        """Make the namespaces, links and shapers; ``close`` removes whatever part of them exists."""

    def close(self) -> None:
        """Put the signal handlers back (a subclass deletes what it made first)."""
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._old_handlers.clear()


class Network(Namespaces):
    """K namespaces on one or two bridges, shaped; a context manager that always tears down.

    Args:
        nodes: each rank's NIC rates.
        region: each rank's region index (0 or 1); None puts every rank on one bridge.
        link: the inter-region link's rate in bytes/s, each direction (needed with two regions).
        mtu: the MTU of every interface (None: the kernel's 1500), e.g. 9001 as on cloud NICs.
    """

    def __init__(self, nodes: Sequence[NodeLink], region: Sequence[int] | None = None, link: float | None = None,
                 mtu: int | None = None) -> None:
        super().__init__()
        self.nodes = list(nodes)
        self.region = list(region) if region is not None else [0] * len(self.nodes)
        if len(self.region) != len(self.nodes) or not set(self.region) <= {0, 1}:
            raise ValueError(f"Network: region must give 0 or 1 for each of the {len(self.nodes)} ranks, "
                             f"got {region!r}")
        if len(set(self.region)) == 2 and link is None:
            raise ValueError("Network: two regions need the inter-region link's rate (link=)")
        self.link = link
        self.mtu = mtu
        self._made: list[tuple[str, str]] = []  # ("netns" | "link", name), in creation order

    def iface(self, rank: int) -> str:
        return f"{self.prefix}e{rank}"

    def close(self) -> None:
        """Delete everything this network made, newest first; safe to call twice."""
        while self._made:
            kind, name = self._made.pop()
            if kind == "netns":
                _sh("ip", "netns", "del", name, check=False)
            else:
                _sh("ip", "link", "del", name, check=False)
        super().close()

    def _build(self) -> None:
        p = self.prefix
        bridges = sorted(set(self.region))
        for b in bridges:
            self._link(f"{p}b{b}", "type", "bridge")
            _sh("ip", "link", "set", f"{p}b{b}", "up")
        if len(bridges) == 2:
            self._link(f"{p}la", "type", "veth", "peer", "name", f"{p}lb")
            for end, b in (("la", 0), ("lb", 1)):
                _sh("ip", "link", "set", f"{p}{end}", "master", f"{p}b{b}", "up")
                _shape(f"{p}{end}", self.link)  # type: ignore[arg-type]  # egress of la: region 0 -> region 1
        for rank, nic in enumerate(self.nodes):
            ns, eth, host = self.netns(rank), self.iface(rank), f"{p}h{rank}"
            _sh("ip", "netns", "add", ns)
            self._made.append(("netns", ns))
            self._link(host, "type", "veth", "peer", "name", eth)
            _sh("ip", "link", "set", eth, "netns", ns)
            _sh("ip", "link", "set", host, "master", f"{p}b{self.region[rank]}", "up")
            inside = ("ip", "netns", "exec", ns)
            _sh(*inside, "ip", "addr", "add", f"{address(rank)}/16", "dev", eth)
            if self.mtu is not None:
                _sh("ip", "link", "set", host, "mtu", str(self.mtu))
                _sh(*inside, "ip", "link", "set", eth, "mtu", str(self.mtu))
            _sh(*inside, "ip", "link", "set", eth, "up")
            _sh(*inside, "ip", "link", "set", "lo", "up")
            uplink, downlink, shaper = nic.uplink, nic.downlink, nic.shaper
            if shaper is not None and uplink is not None:
                _shape_real(eth, uplink, shaper, ns)
                if shaper.both:
                    self._ifb(rank, eth, ns, lambda dev: _shape_real(dev, uplink, shaper, ns))
                continue
            if uplink is not None:
                _shape(eth, uplink, ns)
                # TCP small queues: a socket keeps at most ~2 ms of its rate (16 KB at least) in the shaper's
                # queue, as over a NIC with a shallow queue. The default (4 MB) lets seconds of data queue at
                # low rates, and the ACKs piggybacked on them arrive seconds late for the other direction.
                limit = max(16384, int(uplink * 0.002))
                _sh(*inside, "sysctl", "-qw", f"net.ipv4.tcp_limit_output_bytes={limit}")
            if downlink is not None and downlink != uplink:
                self._ifb(rank, eth, ns, lambda dev: _shape(dev, downlink, ns))

    def _ifb(self, rank: int, eth: str, ns: str, shape: Callable[[str], None]) -> None:
        """Redirect ``eth``'s ingress to an ifb (inside ``ns``) and shape that with ``shape``."""
        ifb = f"{self.prefix}i{rank}"
        inside = ("ip", "netns", "exec", ns)
        _sh(*inside, "ip", "link", "add", ifb, "type", "ifb")
        _sh(*inside, "ip", "link", "set", ifb, "up")
        _sh(*inside, "tc", "qdisc", "add", "dev", eth, "handle", "ffff:", "ingress")
        _sh(*inside, "tc", "filter", "add", "dev", eth, "parent", "ffff:", "protocol", "all", "u32",
            "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", ifb)
        shape(ifb)

    def _link(self, name: str, *spec: str) -> None:
        _sh("ip", "link", "add", name, *spec)
        self._made.append(("link", name))


# ---------------------------------------------------------------- leftovers
def _ours() -> Iterator[tuple[str, str]]:
    """("netns" | "link", name) of every object in the root namespace that carries the exonet prefix."""
    for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX):
            yield "netns", name
    for line in _sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        fields = line.split(":")
        if len(fields) > 1:
            name = fields[1].strip().split("@")[0]
            if name.startswith(PREFIX):
                yield "link", name


def _alive(pid_hex: str) -> bool:
    with contextlib.suppress(ValueError):
        pid = int(pid_hex, 16)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return False


def leftovers(include_live: bool = False) -> list[tuple[str, str]]:
    """Namespaces and links with the exonet prefix whose creating process has gone (or all, ``include_live``)."""
    out = []
    for kind, name in _ours():
        m = _NAME.match(name)
        if include_live or m is None or not _alive(m.group(1)):
            out.append((kind, name))
    return out


def remove_leftovers() -> list[str]:
    """Delete what a crashed earlier run left behind (and stop its node processes); returns the names removed."""
    gone = []
    for kind, name in leftovers():
        if kind == "netns":  # node processes of the crashed run may still be waiting inside
            for pid in _sh("ip", "netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        _sh(*(("ip", "netns", "del") if kind == "netns" else ("ip", "link", "del")), name, check=False)
        gone.append(name)
    return gone
