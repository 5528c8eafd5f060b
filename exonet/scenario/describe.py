"""What ``Scenario.describe`` prints: one function per section of a checked scenario document.

Each section takes the document (or its ``[network]``) and returns its lines, none when the document
leaves that section out; ``sections`` puts them in order and ``layout`` folds a resolved scenario's
ranks into rows. A backend's section names the model that will run: the library, its NIC and sockets,
the algorithm and protocol (each marked set, preset, or the library's default) and what runs each op.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import groupby
from typing import Any

from exonet import units
from exonet.scenario.resolved import FLOW_RATE, STORE_LATENCY, STORE_THROUGHPUT, FailureSpec, NcclSpec, Resolved
from exonet.scenario.schema import FAMILIES, NCCL_ALGORITHMS


def sections(p: Mapping[str, Any], family: str, nccl: NcclSpec | None, num_nodes: int | None,
             said: str = "set") -> list[str]:
    """Every section's lines in order: network, the collective model, hosts, compute, placement, links, the
    object store, nodes, stragglers, events, failures (their expected count for ``num_nodes``, else per node).
    ``said`` is how a backend setting the document gives is marked: "set" (the user's) or "preset" (a preset's)."""
    lines = [*_network_lines(p["network"]), *_collective_lines(family, p, nccl, said), *_host_lines(p),
             _compute_line(p),
             *_placement_lines(p), *_link_lines(p), *_store_lines(p), *_node_lines(p), *_straggler_lines(p),
             *_event_lines(p)]
    if "failures" in p:
        lines.extend(_failures(FailureSpec(**p["failures"]), num_nodes))
    return lines


def _network_lines(net: Mapping[str, Any]) -> list[str]:
    """The per-node NIC, latency and sharing, then the transport's settings."""
    rate, secs = units.format_rate, units.format_time
    up, down = net.get("uplink", net.get("bandwidth")), net.get("downlink", net.get("bandwidth"))
    nic = rate(up) if up == down else f"{rate(up)} up / {rate(down)} down"
    latency, sharing = secs(net.get("latency", 0.0)), net.get("sharing", "max-min")
    return [f"  network     {nic} per node, latency {latency} one-way, sharing {sharing}",
            f"              {', '.join(_transport_settings(net))}"]


def _transport_settings(net: Mapping[str, Any]) -> list[str]:
    """The transport's settings the document gives (efficiency always: it defaults to 1)."""
    secs = units.format_time
    extras = [f"efficiency {net.get('efficiency', 1.0):g}"]
    if "tcp_window" in net:
        extras.append(f"TCP window {units.format_bytes(net['tcp_window'], binary=True)}")
    if "mss" in net:
        extras.append(f"framing {net['mss']:g} B payload + {net.get('header_bytes', 0):g} B headers per packet")
    if "message_overhead" in net:
        shared = f" (x max(1, nodes / {net['host_cores']:g} shared cores))" if "host_cores" in net else ""
        extras.append(f"message overhead {secs(net['message_overhead'])}{shared}")
    if "queue" in net:
        value, unit = net["queue"]
        extras.append(f"queue {secs(value) if unit == 's' else units.format_bytes(value)} per NIC direction")
    if "streams" in net:
        extras.append(f"{net['streams']} TCP stream{'s' if net['streams'] > 1 else ''} per transfer")
    if "setup" in net:
        extras.append(f"set-up {secs(net['setup'])} per group")
    if "flow_rate" in net:
        extras.append(f"at most {units.format_rate(net['flow_rate'])} per TCP flow")
    return extras


def _collective_lines(family: str, p: Mapping[str, Any], nccl: NcclSpec | None, said: str) -> list[str]:
    """The model that runs each op: the phase family's algorithms, or the backend's, with where each came from."""
    net = p["network"]
    overrides = net.get("algorithms", {})
    if "backend" not in net:
        algos = {**FAMILIES[family], **overrides}
        return [f"  collective  {family}: {', '.join(f'{op}={algo}' for op, algo in algos.items())}"]
    lines = _nccl_lines(net, nccl, "hosts" in p, said) if nccl is not None else _gloo_lines(net, "hosts" in p, said)
    for op, algo in overrides.items():  # the lines above name the backend's; this op runs the phase model's instead
        lines.append(f"              instead, {op}: exonet's phase {algo} ({said} in [network.algorithms]) on "
                     f"{family}'s sockets, not {family}'s own")
    return lines


def _origin(net: Mapping[str, Any], key: str, said: str, default: str = "default") -> str:
    """Where a backend setting came from: the document (``said``: set, or a preset's), or the library's default."""
    return said if key in net else default


def _nccl_lines(net: Mapping[str, Any], spec: NcclSpec, hosts: bool, said: str) -> list[str]:
    """What NCCL runs: algorithm and protocol (the tuner's choice unless set), channels, sockets, buffer, levels."""
    given = net.get("nccl", {})
    if "algorithm" in given or net.get("collective") in NCCL_ALGORITHMS:
        algorithm = f"{spec.algorithm} ({said}, as NCCL_ALGO)"
    else:
        algorithm = "the tuner's choice of ring or tree per call (NCCL's default)"
    protocol = (f"{spec.protocol} ({said})" if "protocol" in given
                else "the tuner's choice of LL or Simple per call (NCCL's default; LL128 is off over sockets)")
    socket = "socket_threads" in given or "socks_per_thread" in given
    wire = ("InfiniBand/RoCE verbs, no TCP" if spec.transport == "ib"
            else f"TCP: {spec.channels * spec.sockets} streams per pair, {spec.channels} channels x {spec.sockets} "
                 f"sockets ({said if socket else f'the {spec.nic} NIC default'})" + _flow_limit(net, spec, said))
    lines = [
        f"  backend     nccl, NIC {spec.nic} ({_origin(given, 'nic', said)}), transport {spec.transport} "
        f"({_origin(given, 'transport', said)})",
        f"              {wire}",
        f"              algorithm: {algorithm}",
        f"              protocol: {protocol}",
        f"              channels: {spec.channels} ({_origin(given, 'channels', said, 'NCCL default for one NIC')}), "
        f"buffer {units.format_bytes(spec.buffsize, binary=True)} ({_origin(given, 'buffsize', said, 'NCCL default')})",
        "  ops         all_reduce: ring or tree as above; all_gather, reduce_scatter: NCCL's ring;",
        "              broadcast: NCCL's ring as a pipelined chain, reduce: the chain towards the root;",
        "              all_to_all, gather, scatter: grouped send/recv; barrier: an all-reduce of one float",
    ]
    if hosts:
        lines += ["  levels      inside a host: the rings' and chains' fabric hops (no TCP);",
                  "              between hosts: a ring per device (rail) through its NIC; the tree between hosts"]
    return lines


def _flow_limit(net: Mapping[str, Any], spec: NcclSpec, said: str) -> str:
    """The per-flow limit NCCL's sockets get: set, the NIC vendor's documented one, or none."""
    if "flow_rate" in net:
        return f", at most {units.format_rate(net['flow_rate'])} per flow ({said})"
    if spec.nic in FLOW_RATE:
        return f", at most {units.format_rate(FLOW_RATE[spec.nic])} per flow ({spec.nic}'s documented limit)"
    return ""


def _gloo_lines(net: Mapping[str, Any], hosts: bool, said: str) -> list[str]:
    """What gloo runs: its ring over every rank, one TCP connection per pair, two collectives of a group in flight."""
    streams = net.get("streams", 1)
    lines = [
        f"  backend     gloo over TCP sockets, {streams} connection{'s' if streams > 1 else ''} per pair "
        f"({_origin(net, 'streams', said)}), {net.get('group_concurrency', 2)} collectives of a group in flight "
        f"({_origin(net, 'group_concurrency', said)})",
        "  ops         all_reduce: gloo's segmented ring; all_gather: gloo's ring in halves; reduce_scatter: ring;",
        "              broadcast: binomial tree, a node sending to all its children at once; all_to_all: direct;",
        "              reduce: its ring reduce-scatter, then a gather to the root; gather, scatter: direct;",
        "              barrier: dissemination",
    ]
    if hosts:
        lines.append("  levels      one ring over every rank, in rank order: a host's devices talk over the fabric, "
                     "hosts through their NICs")
    return lines


def _host_lines(p: Mapping[str, Any]) -> list[str]:
    if "hosts" not in p:
        return []
    h = p["hosts"]
    latency = units.format_time(h.get("latency", 0.0))
    fabric = f"fabric {units.format_rate(h['bandwidth'])} per device, latency {latency}"
    return [f"  hosts       {h['devices']} devices per host, {fabric}, NIC {h.get('nic', 'per-device')}"]


def _compute_line(p: Mapping[str, Any]) -> str:
    compute = p.get("compute", {})
    mode = compute.get("mode", "measured")
    flops = f" ({compute['tflops']:g} TFLOP/s x mfu {compute.get('mfu', 1.0):g})" if mode == "flops" else ""
    return f"  compute     {mode}{flops}"


def _placement_lines(p: Mapping[str, Any]) -> list[str]:
    """The regions, then where the server ranks live."""
    lines = []
    for r in p.get("regions", []):
        where = f"share {r['share']:g}" if "share" in r else f"ranks {list(r['ranks'])}"
        price = f", egress {_per_gb(r['egress'])}" if "egress" in r else ""
        lines.append(f"  region      {r['name']}: {where}{price}")
    if "server" in p:
        lines.append(f"  server      region {p['server']['region']} (a server rank, after the trainers)")
    elif p.get("regions"):
        lines.append("  server      rank 0's region (a server rank, after the trainers; set [server] region)")
    return lines


def _link_lines(p: Mapping[str, Any]) -> list[str]:
    lines = []
    for link in p.get("links", []):
        lat = units.format_time(link.get("latency", p["network"].get("latency", 0.0)))
        a, b = link["between"]
        price = f", egress {_per_gb(link['egress'])} either way" if "egress" in link else ""
        lines.append(f"  link        {a} <-> {b}: {units.format_rate(link['bandwidth'])}, latency {lat}{price}")
    return lines


def _store_lines(p: Mapping[str, Any]) -> list[str]:
    """The ``[store]`` a trace's puts and gets go through (none without the table), each default marked."""
    if "store" not in p:
        return []
    store = p["store"]
    latency = (units.format_time(store["latency"]) if "latency" in store
               else f"{units.format_time(STORE_LATENCY)} (default)")
    throughput = (units.format_rate(store["throughput"]) if "throughput" in store
                  else f"{units.format_rate(STORE_THROUGHPUT)} (default)")
    rates = [f"{key} {units.format_rate(store[key])} per peer" for key in ("upload", "download") if key in store]
    region = store.get("region", "rank 0's region")
    return [f"  store       latency {latency}, throughput {throughput}, "
            f"{', '.join(rates) or 'each peer at its NIC (default)'}, in {region} (comm.put/get)"]


def _per_gb(per_byte: float) -> str:
    """A price in dollars per byte as "$0.08/GB"."""
    return f"${per_byte * 1e9:.4g}/GB"


def _node_lines(p: Mapping[str, Any]) -> list[str]:
    lines = []
    for node in p.get("nodes", []):
        sets = [f"{k} {f'{v:g}' if k == 'speed' else units.format_rate(v)}"
                for k, v in node.items() if k not in ("ranks", "share")]
        lines.append(f"  nodes       {_who(node)}: {', '.join(sets)}")
    return lines


def _straggler_lines(p: Mapping[str, Any]) -> list[str]:
    strag = p.get("stragglers", {})
    if strag.get("jitter", "none") == "none":
        return []
    jitter, sigma, seed = strag["jitter"], strag["sigma"], strag.get("seed", 0)
    return [f"  stragglers  {jitter} jitter, sigma {sigma:g}, seed {seed}"]


def _event_lines(p: Mapping[str, Any]) -> list[str]:
    lines = []
    for e in p.get("events", []):
        by_step = "from_step" in e or "to_step" in e
        lo, hi, fmt = ("from_step", "to_step", str) if by_step else ("from_s", "to_s", units.format_time)
        span = f"{fmt(e.get(lo, 0))} to {fmt(e[hi]) if hi in e else 'end'}"
        what = f"slow x{e['factor']:g}" if e["kind"] == "slow" else "down"
        lines.append(f"  event       {what}, {_who(e)}, {'steps' if by_step else 'time'} {span}")
    return lines


def _failures(f: FailureSpec, num_nodes: int | None) -> list[str]:
    """The failure process in words, with the failures a run can expect."""
    secs = units.format_time
    repair = {"fixed": secs(f.repair), "exponential": f"Exp(mean {secs(f.repair)})",
              "lognormal": f"lognormal(mean {secs(f.repair)}, sigma {f.sigma:g})"}[f.distribution]
    nodes = "nodes" if num_nodes is None else units.plural(num_nodes, "node")
    per_hour = f.expected_failures(1 if num_nodes is None else num_nodes, 3600.0)
    cycle = secs(f.mtbf + f.repair + f.restart)
    return [f"  failures    per node: up Exp(mtbf {secs(f.mtbf)}), then down {repair} + restart {secs(f.restart)}, "
            f"seed {f.seed}{'' if f.servers else '; server ranks do not fail'}",
            f"              expected failures: {nodes} x T / {cycle} = {per_hour:.4g} per hour of run"
            + ("" if num_nodes is not None else " per node"),
            *([f"              worker model: a failure takes down {units.plural(f.slice, 'device')}; an elastic "
               f"worker pauses {secs(f.pause)} per failure"] if f.slice > 1 or f.pause > 0 else [])]


def _who(entry: Mapping[str, Any]) -> str:
    return f"ranks {list(entry['ranks'])}" if "ranks" in entry else f"last {entry['share'] * 100:g}% of ranks"


def layout(r: Resolved) -> list[str]:
    """Per-rank rows of a resolved scenario, consecutive identical ranks folded into one row."""
    out = []
    per_rank = zip(range(r.num_nodes), zip(r.region, r.uplink, r.downlink, r.speed))
    for (region, up, down, speed), group in groupby(per_rank, key=lambda item: item[1]):
        ranks = [rank for rank, _ in group]
        span = str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"
        rates = f"up {units.format_rate(up):<12} down {units.format_rate(down):<12}"
        out.append(f"    ranks {span:<8} {region:<12} {rates} speed {speed:g}")
    return out
