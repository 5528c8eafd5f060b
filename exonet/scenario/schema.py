"""The scenario schema: what a scenario document may say, checked field by field.

``exonet.scenario`` turns a checked document into a ``Scenario`` and resolves it for a
node count; this module holds what that rests on and what a person reads to learn the
file format: the TOML parser's error wording, one check per field (each returns the
value in SI base units or raises ``ScenarioError`` naming the file and key, with a
"did you mean" hint for a misspelt key or value), the tables and arrays that make up
a document, and the rules that span fields (``validate``). It also names the choices
the simulator implements (``ALGORITHMS``, ``FAMILIES``, sharing, compute modes,
jitters, event kinds), since those are the schema's allowed values.
"""

from __future__ import annotations

import difflib
import math
import sys
from collections.abc import Callable, Mapping
from fractions import Fraction
from functools import partial
from typing import Any

from exonet import units
from exonet.errors import ScenarioError
from exonet.trace import OPS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


# The algorithms the simulator implements, per op, and the family each `network.collective` picks.
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "halving_doubling", "tree", "star", "direct", "hierarchical", "nccl", "gloo"),
    "all_gather": ("ring", "halving_doubling", "star", "direct", "hierarchical", "nccl", "gloo"),
    "reduce_scatter": ("ring", "halving_doubling", "star", "direct", "hierarchical", "nccl"),
    "broadcast": ("chain", "binomial", "binomial_fanout", "star", "direct", "hierarchical", "nccl"),
    "all_to_all": ("direct", "star"),
    "reduce": ("chain", "binomial", "star", "direct", "hierarchical", "nccl", "gloo"),
    "gather": ("direct", "binomial"),
    "scatter": ("direct", "binomial"),
    "barrier": ("dissemination", "star", "direct", "nccl"),
}
# Each family's algorithm per op, in the order of OPS. Rooted ops (broadcast, reduce, gather, scatter) root at
# the group's lowest rank; NCCL's and gloo's gather and scatter are their grouped sends, the direct algorithm.
FAMILIES: dict[str, dict[str, str]] = {
    name: dict(zip(OPS, algos))
    for name, algos in {
        "ring": ("ring", "ring", "ring", "chain", "direct", "chain", "direct", "direct", "dissemination"),
        "halving_doubling": ("halving_doubling", "halving_doubling", "halving_doubling", "binomial", "direct",
                             "binomial", "binomial", "binomial", "dissemination"),
        "tree": ("tree", "ring", "ring", "binomial", "direct", "binomial", "binomial", "binomial", "dissemination"),
        "star": ("star",) * 6 + ("direct", "direct", "star"),
        "direct": ("direct",) * 9,
        "hierarchical": ("hierarchical",) * 4 + ("direct", "hierarchical", "direct", "direct", "dissemination"),
        "nccl": ("nccl",) * 4 + ("direct", "nccl", "direct", "direct", "nccl"),
        "gloo": ("gloo", "gloo", "ring", "binomial_fanout", "direct", "gloo", "direct", "direct", "dissemination"),
    }.items()
}
# What `network.backend` names: the library whose collectives and sockets the scenario's hosts run.
BACKENDS = ("nccl", "gloo")
# With a backend, `network.collective` names one of that library's algorithms: its own name (the library as it runs
# by default: NCCL's tuner, gloo's ring), or NCCL_ALGO's "ring" and "tree", or gloo's "ring". exonet's phase
# algorithms ("halving_doubling", "hierarchical", ...) need no backend.
BACKEND_COLLECTIVES: dict[str, tuple[str, ...]] = {"nccl": ("nccl", "ring", "tree"), "gloo": ("gloo", "ring")}
NCCL_ALGORITHMS = ("auto", "ring", "tree")
NCCL_PROTOCOLS = ("auto", "simple", "ll", "ll128")
NCCL_NICS = ("generic", "aws", "gcp")
NCCL_TRANSPORTS = ("socket", "ib")
SHARING = ("max-min", "fifo")
COMPUTE_MODES = ("measured", "wall", "flops")
JITTERS = ("none", "lognormal", "normal", "exponential")
EVENT_KINDS = ("slow", "down")
NICS = ("per-device", "per-host")
REPAIRS = ("fixed", "exponential", "lognormal")
DEFAULT_REGION = "default"

# ---------------------------------------------------------------- field checks
# A check takes (value, where) and returns the value in SI base units or raises ScenarioError.
Check = Callable[[Any, str], Any]


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ScenarioError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _number(low: float, high: float | None = None, *, closed: bool = False) -> Check:
    """A finite number above ``low`` (or equal when ``closed``), at most ``high``."""
    expected = f"{'[' if closed else '('}{low:g}, {'inf)' if high is None else f'{high:g}]'}"

    def check(value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ScenarioError(f"{where}: expected a number in {expected}, got {value!r}")
        number = float(value) if isinstance(value, float) or abs(value) < 2**63 else math.inf
        ok = math.isfinite(number) and (number >= low if closed else number > low) and (high is None or number <= high)
        if not ok:
            raise ScenarioError(f"{where}: {value!r} is out of range; expected a number in {expected}")
        return number

    return check


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ScenarioError(f"{where}: expected a non-negative integer, got {value!r}")
    return value


def _positive_count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ScenarioError(f"{where}: expected an integer >= 1, got {value!r}")
    return value


def _at_most(high: int, why: str) -> Check:
    """An integer in [1, ``high``]: the model does work per unit, so a count past what the system has would hang."""

    def check(value: Any, where: str) -> int:
        count = _positive_count(value, where)
        if count > high:
            raise ScenarioError(f"{where}: {value!r} is too many; expected an integer in [1, {high}] ({why})")
        return count

    return check


def _buffsize(value: Any, where: str) -> float:
    """NCCL_BUFFSIZE: at least 4 KiB, so a step (an eighth of it) holds whole lines and the loop count stays finite."""
    size = _window(value, where)
    if size < 4096:
        raise ScenarioError(f"{where}: {value!r} is too small; NCCL's buffer is at least 4 KiB (default 4 MiB)")
    return size


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ScenarioError(f"{where}: expected true or false, got {value!r}")
    return value


def _enum(choices: tuple[str, ...]) -> Check:
    def check(value: Any, where: str) -> str:
        if value not in choices or not isinstance(value, str):
            hint = did_you_mean(value, choices) if isinstance(value, str) else ""
            raise ScenarioError(f"{where}: unknown value {value!r}{hint}; expected one of: {', '.join(choices)}")
        return value

    return check


_rate: Check = units.parse_rate
_time: Check = units.parse_time
_window: Check = partial(units.parse_size, allow_zero=False)


def _tcp_window(value: Any, where: str) -> float:
    """A TCP window: at least one byte, since a window carries whole bytes (less would make a flow's rate vanish)."""
    size = _window(value, where)
    if size < 1:
        raise ScenarioError(f"{where}: {value!r} is less than one byte; a TCP window carries whole bytes "
                            f'(Linux\'s default is 2.8 MiB, e.g. "2.8 MiB")')
    return size


QUEUE_MIN = {"bytes": 1.0, "s": 1e-6}  # one byte; one microsecond, the unit tc takes a queue's latency in


def _queue(value: Any, where: str) -> tuple[float, str]:
    """A bottleneck queue: bytes ("345 KB") or a time at the link's rate ("50 ms"), as (value, "bytes" | "s").

    At least one byte or one microsecond, which keeps the model's recovery term finite (below them a transfer's
    rate vanished and the replay failed). A time holds rate × time bytes, so a microsecond on a very slow link
    holds less than a packet: accepted, and as slow as such a queue is."""
    hint = ""
    if isinstance(value, str):
        for parse, unit in ((units.parse_size, "bytes"), (units.parse_time, "s")):
            try:
                queue = parse(value, where, allow_zero=False)
            except ScenarioError as err:
                found = str(err).find(" (did you mean")
                hint = hint or (str(err)[found:].split(";")[0] if found >= 0 else "")
                continue
            if queue < QUEUE_MIN[unit]:
                raise ScenarioError(f'{where}: {value!r} holds nothing; a queue is at least "1 B" or "1 us" '
                                    f'(a tbf queue is typically its rate x 50 ms, e.g. "50 ms")')
            return queue, unit
    raise ScenarioError(f'{where}: expected a positive size such as "345 KB" or a time at the link rate such as '
                        f'"50 ms", got {value!r}{hint}')


def _seconds(value: Any, where: str) -> float:
    """A point in simulated time: a number of seconds (the key says so) or a time string."""
    if isinstance(value, str):
        return units.parse_time(value, where)
    return _number(0, units.MAX_TIME, closed=True)(value, where)


def _ranks(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)) or not value:
        raise ScenarioError(f"{where}: expected a non-empty list of ranks such as [0, 1], got {value!r}")
    ranks = tuple(_count(r, f"{where}[{i}]") for i, r in enumerate(value))
    if len(set(ranks)) != len(ranks):
        raise ScenarioError(f"{where}: rank listed twice in {list(ranks)}")
    return ranks


def _between(value: Any, where: str) -> tuple[str, str]:
    if not isinstance(value, (list, tuple)) or len(value) != 2 or not all(isinstance(v, str) and v for v in value):
        raise ScenarioError(f'{where}: expected two region names such as ["us", "eu"], got {value!r}')
    if value[0] == value[1]:
        raise ScenarioError(f"{where}: a link joins two different regions, got {value!r}")
    return (value[0], value[1])


def did_you_mean(word: str, choices: Any) -> str:
    """' (did you mean ...?)' naming the choice closest to ``word``, or "" when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _table(spec: Mapping[str, Check], label: str) -> Check:
    """A TOML table whose keys are all in ``spec``; ``label`` names it in the list of valid keys."""

    def check(value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ScenarioError(f"{where}: expected a table ({label}), got {type(value).__name__}")
        out = {}
        for key, item in value.items():
            child = f"{where}{key}" if where.endswith(": ") else f"{where}.{key}"  # "file: " is the top level
            if not isinstance(key, str) or key not in spec:
                hint = did_you_mean(key, spec) if isinstance(key, str) else ""
                raise ScenarioError(f"{child}: unknown key{hint}; valid keys in {label}: {', '.join(spec)}")
            out[key] = spec[key](item, child)
        return out

    return check


def _array(spec: Mapping[str, Check], label: str) -> Check:
    """A TOML array of tables, each checked against ``spec``."""

    def check(value: Any, where: str) -> list[dict[str, Any]]:
        if not isinstance(value, (list, tuple)):
            raise ScenarioError(f"{where}: expected an array of tables ({label}), got {type(value).__name__}")
        return [_table(spec, label)(item, f"{where}[{i}]") for i, item in enumerate(value)]

    return check


# ---------------------------------------------------------------- the document
# NETWORK, TABLES and ARRAYS also tell ``Scenario.replace`` which keys it may change.
_ALGORITHMS = {op: _enum(choices) for op, choices in ALGORITHMS.items()}
NETWORK = {
    "collective": _enum(tuple(FAMILIES)), "bandwidth": _rate, "uplink": _rate, "downlink": _rate, "latency": _time,
    "sharing": _enum(SHARING), "efficiency": _number(1e-3, 1, closed=True), "tcp_window": _tcp_window,
    "group_concurrency": _at_most(1024, "collectives of one group in flight at once"),
    "algorithms": _table(_ALGORITHMS, "[network.algorithms]"),
    "mss": _number(64, 1e9, closed=True), "header_bytes": _number(0, 1e6, closed=True), "message_overhead": _time,
    "host_cores": _number(1e-3, 1e6, closed=True), "queue": _queue,
    "streams": _at_most(1024, "TCP connections per pair of nodes"), "setup": _time, "flow_rate": _rate,
    "backend": _enum(BACKENDS), "slow_start_after_idle": _flag,
    "nccl": _table({"algorithm": _enum(NCCL_ALGORITHMS), "protocol": _enum(NCCL_PROTOCOLS),
                    "channels": _at_most(64, "NCCL runs at most 64 channels"), "nic": _enum(NCCL_NICS),
                    "transport": _enum(NCCL_TRANSPORTS),
                    "socket_threads": _at_most(16, "NCCL_SOCKET_NTHREADS is at most 16"),
                    "socks_per_thread": _at_most(16, "NCCL_NSOCKS_PERTHREAD is at most 16"), "buffsize": _buffsize},
                   "[network.nccl]"),
}
_COMPUTE = {"mode": _enum(COMPUTE_MODES), "tflops": _number(1e-9, 1e9, closed=True),
            "mfu": _number(1e-6, 1, closed=True)}
_price: Check = units.parse_price  # dollars per byte leaving a region ("0.08 $/GB")
# share 0: a region that holds no trainer, only a server or the object store ([server] / [store] region)
_REGION = {"name": _string, "ranks": _ranks, "share": _number(0, 1, closed=True), "egress": _price}
_LINK = {"between": _between, "bandwidth": _rate, "latency": _time, "egress": _price}
_NODE = {
    "ranks": _ranks, "share": _number(0, 1), "speed": _number(1e-6, 1e6, closed=True), "bandwidth": _rate,
    "uplink": _rate,
    "downlink": _rate,
}
_STRAGGLERS = {"jitter": _enum(JITTERS), "sigma": _number(0, 10, closed=True), "seed": _count}
_EVENT = {
    "kind": _enum(EVENT_KINDS), "ranks": _ranks, "share": _number(0, 1), "from_step": _count, "to_step": _count,
    "from_s": _seconds, "to_s": _seconds, "factor": _number(1e-6, 1e6, closed=True),
}
_HOSTS = {"devices": _positive_count, "bandwidth": _rate, "latency": _time, "nic": _enum(NICS)}
_SERVER = {"region": _string}  # where a strategy's server ranks live (they never move the trainers)
# an object store between peers (comm.put / comm.get): per-request latency, each peer's rates to and from it, its own
_STORE = {"latency": _time, "upload": _rate, "download": _rate, "throughput": _rate, "region": _string}
_FAILURES: dict[str, Check] = {
    "mtbf": partial(units.parse_time, allow_zero=False), "repair": _time, "restart": _time,
    "distribution": _enum(REPAIRS), "sigma": _number(0, 10, closed=True), "seed": _count, "servers": _flag,
    "slice": _positive_count, "pause": _time,
}
TABLES: dict[str, Mapping[str, Check]] = {
    "network": NETWORK, "compute": _COMPUTE, "stragglers": _STRAGGLERS, "hosts": _HOSTS, "server": _SERVER,
    "store": _STORE,
    "failures": _FAILURES,
}
ARRAYS: dict[str, Mapping[str, Check]] = {"regions": _REGION, "links": _LINK, "nodes": _NODE, "events": _EVENT}
_TOP = _table(
    {
        "name": _string,
        "description": lambda value, where: value if value == "" else _string(value, where),
        **{key: _table(spec, f"[{key}]") for key, spec in TABLES.items()},
        **{key: _array(spec, f"[[{key}]]") for key, spec in ARRAYS.items()},
    },
    "the top level",
)


def validate(raw: Any, source: str) -> dict[str, Any]:
    """Check every key and value of ``raw``, then the rules that span fields; return it in SI units."""
    if not isinstance(raw, Mapping):
        got = type(raw).__name__
        raise ScenarioError(f"{source}: expected a table (dict) with at least `name` and [network], got {got}")
    p = _TOP(raw, f"{source}: ")
    for rule in _RULES:
        rule(p, f"{source}:")
    return p


# ---------------------------------------------------------------- rules that span fields
# A rule takes the document, its keys and values already checked, and ``where`` ("file:"); it raises
# ScenarioError when the document breaks it.
Rule = Callable[[Mapping[str, Any], str], None]


def _check_required(p: Mapping[str, Any], where: str) -> None:
    """A name, a [network], and a NIC rate in it."""
    if "name" not in p:
        raise ScenarioError(f'{where} missing required key `name` (e.g. name = "two-regions")')
    net = p.get("network")
    if net is None:
        raise ScenarioError(f'{where} missing required table [network] (e.g. [network] bandwidth = "1 Gbit/s")')
    if "bandwidth" not in net and not ("uplink" in net and "downlink" in net):
        raise ScenarioError(
            f'{where} network.bandwidth is required (e.g. bandwidth = "1 Gbit/s") '
            "unless both uplink and downlink are given"
        )


def _check_network(p: Mapping[str, Any], where: str) -> None:
    """[network] keys that only act through another: each needs it set."""
    net = p["network"]
    if "host_cores" in net and "message_overhead" not in net:
        raise ScenarioError(f"{where} network.host_cores only scales network.message_overhead; set message_overhead")
    if "header_bytes" in net and "mss" not in net:
        raise ScenarioError(f"{where} network.header_bytes only applies with network.mss "
                            "(TCP payload bytes per packet)")
    if "tcp_window" in net and not (net.get("latency", 0.0) > 0
                                    or any(l.get("latency", 0.0) > 0 for l in p.get("links", []))):
        raise ScenarioError(
            f"{where} network.tcp_window: has no effect, because every latency is 0: a window caps a flow at "
            "window / (2 · latency), so a zero round trip never binds; set network.latency (or a link's latency) "
            "or remove tcp_window"
        )


def _check_hosts(p: Mapping[str, Any], where: str) -> None:
    hosts = p.get("hosts")
    if hosts is not None:
        _need(hosts, "devices", f"{where} [hosts]", "devices = 8")
        _need(hosts, "bandwidth", f"{where} [hosts]", 'bandwidth = "450 GB/s" (the intra-host fabric, each direction)')


def _check_backend(p: Mapping[str, Any], where: str) -> None:
    """What needs network.backend: NCCL settings, a backend's collective, and streams without a window or queue."""
    net = p["network"]
    if "nccl" in net and net.get("backend") != "nccl":
        raise ScenarioError(f'{where} network.nccl: describes NCCL, so it needs network.backend = "nccl" '
                            f"(backend is {net.get('backend', 'not set')!r})")
    if net.get("collective") in BACKENDS and net.get("backend") != net["collective"]:
        raise ScenarioError(f'{where} network.collective: "{net["collective"]}" needs network.backend = '
                            f'"{net["collective"]}"')
    _check_backend_collective(net, where)
    if net.get("streams", 1) > 1 and "tcp_window" not in net and "queue" not in net and "backend" not in net:
        raise ScenarioError(
            f"{where} network.streams: has no effect on its own; streams act through network.tcp_window (a transfer "
            "has N windows) or network.queue (each stream's share of it); set one of them or remove streams"
        )


def _check_backend_collective(net: Mapping[str, Any], where: str) -> None:
    """With a backend, ``collective`` names one of its algorithms, and says it once: an NCCL_ALGO given both as
    ``collective`` and as ``[network.nccl] algorithm`` must agree."""
    backend, name = net.get("backend"), net.get("collective")
    if backend is None or name is None:
        return
    runs = BACKEND_COLLECTIVES[backend]
    if name not in runs:
        phase = " (exonet's phase model: remove network.backend to run it)" if name in FAMILIES else ""
        raise ScenarioError(f'{where} network.collective: {backend} does not run "{name}"{phase}; with backend = '
                            f'"{backend}" choose one of: {", ".join(runs)}')
    chosen = net.get("nccl", {}).get("algorithm", "auto")
    if backend == "nccl" and name in NCCL_ALGORITHMS and chosen not in ("auto", name):
        raise ScenarioError(f'{where} network.collective = "{name}" and network.nccl.algorithm = "{chosen}" '
                            "name two algorithms; say it once (collective, as NCCL_ALGO)")


def _check_compute(p: Mapping[str, Any], where: str) -> None:
    compute = p.get("compute", {})
    if compute.get("mode") == "flops" and "tflops" not in compute:
        raise ScenarioError(f'{where} compute.tflops is required when compute.mode = "flops" (e.g. tflops = 989.0)')
    for key in ("tflops", "mfu"):
        if key in compute and "mode" not in compute:
            raise ScenarioError(f'{where} compute.{key} only applies with compute.mode = "flops"; set mode')


def _check_server(p: Mapping[str, Any], where: str) -> None:
    """``[server] region`` and ``[store] region`` name regions of the scenario."""
    regions = [r["name"] for r in p.get("regions", []) if "name" in r]
    for table in ("server", "store"):
        region = p.get(table, {}).get("region")
        if region is not None and region not in regions:
            hint = did_you_mean(region, regions)
            raise ScenarioError(f"{where} {table}.region: {region!r} is not a region of this scenario{hint}; "
                                f"regions: {', '.join(map(repr, regions)) or 'none (add [[regions]])'}")


def _check_stragglers(p: Mapping[str, Any], where: str) -> None:
    strag = p.get("stragglers", {})
    if strag.get("jitter", "none") != "none" and "sigma" not in strag:
        jitter = strag["jitter"]
        raise ScenarioError(f"{where} stragglers.sigma is required when stragglers.jitter = {jitter!r} "
                            "(e.g. sigma = 0.1)")
    if "sigma" in strag and "jitter" not in strag:
        raise ScenarioError(f"{where} stragglers.sigma needs stragglers.jitter ({', '.join(JITTERS)})")


def _check_failures(p: Mapping[str, Any], where: str) -> None:
    if "failures" not in p:
        return
    failures, where = p["failures"], f"{where} failures"
    _need(failures, "mtbf", where, 'mtbf = "50 h"')
    distribution = failures.get("distribution", "fixed")
    if distribution == "lognormal" and "sigma" not in failures:
        raise ScenarioError(f"{where}.sigma: is required when distribution = 'lognormal' (e.g. sigma = 0.5)")
    if "sigma" in failures and distribution != "lognormal":
        raise ScenarioError(f"{where}.sigma: applies only to distribution = 'lognormal'")
    if distribution != "fixed" and not failures.get("repair", 0.0) > 0:
        raise ScenarioError(f"{where}.distribution: {distribution!r} draws repair times around `repair`; "
                            "set repair > 0")


def _check_regions(p: Mapping[str, Any], where: str) -> None:
    """Each region named once, with ranks or a share; the shares at most 1 in all."""
    names: list[str] = []
    for i, region in enumerate(p.get("regions", [])):
        _need(region, "name", f"{where} regions[{i}]", 'name = "us"')
        _one_of_ranks_share(region, f"{where} regions[{i}]")
        if region["name"] in names:
            raise ScenarioError(f"{where} regions[{i}].name: region {region['name']!r} is listed twice")
        names.append(region["name"])
    if sum(Fraction(r.get("share", 0)) for r in p.get("regions", [])) > 1 + Fraction(1, 10**9):
        raise ScenarioError(f"{where} regions: the shares add up to more than 1")


def _check_links(p: Mapping[str, Any], where: str) -> None:
    """Each link joins two known regions (after ``_check_regions``: each has a name), and no pair twice."""
    names = [r["name"] for r in p.get("regions", [])]
    pairs: set[tuple[str, ...]] = set()
    for i, link in enumerate(p.get("links", [])):
        _need(link, "between", f"{where} links[{i}]", 'between = ["us", "eu"]')
        _need(link, "bandwidth", f"{where} links[{i}]", 'bandwidth = "10 Gbit/s"')
        for name in link["between"]:
            if name not in names and name != DEFAULT_REGION:
                hint, valid = did_you_mean(name, names), ", ".join([*names, DEFAULT_REGION])
                raise ScenarioError(f"{where} links[{i}].between: unknown region {name!r}{hint}; regions: {valid}")
        pair = tuple(sorted(link["between"]))
        if pair in pairs:
            joined = f"regions {pair[0]!r} and {pair[1]!r}"
            raise ScenarioError(f"{where} links[{i}].between: {joined} are already joined by another link")
        pairs.add(pair)


def _check_nodes(p: Mapping[str, Any], where: str) -> None:
    for i, node in enumerate(p.get("nodes", [])):
        _one_of_ranks_share(node, f"{where} nodes[{i}]")
        if not {"speed", "bandwidth", "uplink", "downlink"} & node.keys():
            raise ScenarioError(f"{where} nodes[{i}]: sets nothing; give speed, bandwidth, uplink or downlink")


def _check_events(p: Mapping[str, Any], where: str) -> None:
    for i, event in enumerate(p.get("events", [])):
        _check_event(event, f"{where} events[{i}]")


# In the order they run: the first rule a document breaks is the error it gets (links rely on regions' names).
_RULES: tuple[Rule, ...] = (
    _check_required, _check_network, _check_hosts, _check_backend, _check_compute, _check_server, _check_stragglers,
    _check_failures, _check_regions, _check_links, _check_nodes, _check_events,
)


def _need(table: Mapping[str, Any], key: str, where: str, example: str) -> None:
    if key not in table:
        raise ScenarioError(f"{where}: missing required key `{key}` (e.g. {example})")


def _one_of_ranks_share(table: Mapping[str, Any], where: str) -> None:
    if ("ranks" in table) == ("share" in table):
        raise ScenarioError(f"{where}: give exactly one of `ranks` (e.g. ranks = [0, 1]) or `share` (e.g. share = 0.5)")


def _check_event(event: Mapping[str, Any], where: str) -> None:
    _need(event, "kind", where, 'kind = "slow"')
    _one_of_ranks_share(event, where)
    steps, secs = ("from_step" in event or "to_step" in event), ("from_s" in event or "to_s" in event)
    if steps and secs:
        raise ScenarioError(f"{where}: give a window in steps (from_step/to_step) or seconds (from_s/to_s), not both")
    if not steps and not secs:
        raise ScenarioError(f"{where}: needs a window: from_step/to_step or from_s/to_s")
    lo, hi = ("from_step", "to_step") if steps else ("from_s", "to_s")
    if hi in event and event[hi] <= event.get(lo, 0):
        raise ScenarioError(f"{where}.{hi}: must be after {lo} ({event.get(lo, 0)!r}), got {event[hi]!r}")
    if event["kind"] == "down" and hi not in event:
        raise ScenarioError(f"{where}: a 'down' event needs an end ({hi}), or the node never returns")
    if event["kind"] == "slow" and "factor" not in event:
        raise ScenarioError(f"{where}: a 'slow' event needs `factor` (compute time multiplier, e.g. factor = 4.0)")
    if event["kind"] == "down" and "factor" in event:
        raise ScenarioError(f"{where}.factor: applies only to kind = 'slow'")


# ---------------------------------------------------------------- TOML text
def parse_toml(text: str, source: str) -> dict[str, Any]:
    """TOML text as a dict; malformed text is a ScenarioError naming ``source`` and the line."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:  # its message carries "(at line N, column M)"
        message = str(err)
        if "line" not in message:  # "(at end of document)": say which line that is
            message += f" (the document ends at line {max(1, len(text.splitlines()))})"
        raise ScenarioError(f"{source}: malformed TOML: {message}") from None
