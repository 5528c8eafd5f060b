"""Scenario: a network and compute environment to replay a trace in (parsed from TOML or a dict).

``Scenario`` is the user-facing description (units as strings, presets by name);
``Resolved`` (exonet.scenario.resolved) is the same scenario made concrete for a given node
count, in SI base units, which is all the simulator reads. This module loads scenarios (files, presets,
dicts), edits them (``replace``), resolves them and describes them; what a document
may say, field by field, and its error messages live in ``exonet.scenario.schema``.

Rules beyond the schema (scenarios/README.md), chosen so a file means one thing:

* Defaults are ideal: ``latency`` "0 s", efficiency 1, no TCP window, no packet framing
  (``mss``/``header_bytes``), no per-message overhead, no bottleneck queue, one TCP
  stream per transfer, no set-up cost, no jitter,
  sharing "max-min", collective "ring" ("hierarchical" when ``[hosts]`` is given), compute
  mode "measured", speed 1, mfu 1. ``[hosts]`` needs ``devices`` and ``bandwidth`` and whole
  hosts (num_nodes a multiple of devices), each inside one region.
  ``network.bandwidth`` is required unless both ``uplink`` and ``downlink`` are given.
  A link's ``latency`` defaults to ``network.latency``. ``efficiency`` scales every
  bandwidth: NICs, per-node overrides and inter-region links.
* ``share`` picks a contiguous block of ranks, whatever the node count. Regions are
  laid from rank 0 in the order listed: with cumulative shares C, region i holds
  ranks [round(C[i-1]·n), round(C[i]·n)) (round half up), so shares summing to 1
  partition the ranks exactly and a region may be empty when n is small. For
  ``[[nodes]]`` and ``[[events]]`` a share means the *last* max(1, round(share·n))
  ranks, so a share > 0 always touches at least one node.
* ``[[nodes]]`` entries apply in order; a later entry overrides an earlier one.
* A parameter of an option that is left at its default is an error, because it
  would silently do nothing: ``sigma`` without ``jitter``, ``tflops``/``mfu``
  without ``compute.mode``, ``streams`` > 1 without ``tcp_window`` or ``queue``.
  With the option set explicitly (say ``jitter = "none"``) the parameter is kept,
  so a sweep can switch the option off and on.
* ``replace(**changes)``: ``name``/``description`` and the network keys by name
  (``bandwidth=``, ``latency=``, ``collective=`` ...); ``network``, ``compute``, ``hosts`` and
  ``stragglers`` take a dict merged into that table; ``regions``, ``links``,
  ``nodes`` and ``events`` take a list that replaces the array. ``None`` removes a key.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import warnings
from collections.abc import Mapping
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any

from exonet import units
from exonet.errors import ScenarioError
from exonet.scenario.describe import layout, sections
from exonet.scenario.lines import with_line
from exonet.scenario.resolved import (
    FLOW_RATE,
    LINUX_WINDOW,
    STORE_LATENCY,
    STORE_THROUGHPUT,
    EventSpec,
    FailureSpec,
    HostSpec,
    LinkSpec,
    NcclSpec,
    Resolved,
    StoreSpec,
)
from exonet.scenario.schema import (
    ALGORITHMS,
    ARRAYS,
    DEFAULT_REGION,
    FAMILIES,
    NCCL_ALGORITHMS,
    NETWORK,
    TABLES,
    did_you_mean,
    parse_toml,
    validate,
)

# ALGORITHMS and FAMILIES belong to the schema; exonet.scenario (the package) re-exports them with these names.
__all__ = ["ALGORITHMS", "FAMILIES", "EventSpec", "FailureSpec", "HostSpec", "LinkSpec", "Resolved", "Scenario",
           "list_presets"]

NIC_KEYS = ("bandwidth", "uplink", "downlink")  # what a [[nodes]] entry may set of its own NIC

# ---------------------------------------------------------------- presets and files
def list_presets() -> list[str]:
    """Names of the scenario presets shipped in ``exonet.presets``."""
    root = resources.files("exonet.presets")
    return sorted(entry.name[: -len(".toml")] for entry in root.iterdir() if entry.name.endswith(".toml"))


def _read_file(path: Path) -> str:
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such scenario file (presets: {', '.join(list_presets())})") from None
    except UnicodeDecodeError as err:
        raise ScenarioError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise ScenarioError(f"{path}: cannot read scenario file: {err.strerror or err}") from None
    return text


# ---------------------------------------------------------------- the Scenario
class Scenario:
    """A validated network and compute environment; immutable (``replace`` returns a copy).

    Args:
        data: the scenario as a dict with the TOML schema (see scenarios/README.md).
        source: where it came from, for error messages (a file path, or "<dict>").
    """

    def __init__(self, data: Mapping[str, Any], source: str = "<dict>") -> None:
        self._parsed = validate(data, source)
        self._data: dict[str, Any] = copy.deepcopy(dict(data))
        self._source = source
        self._text: str | None = None  # the TOML it was read from, so that a later error can name the line

    @classmethod
    def load(cls, path_or_name: str | os.PathLike[str]) -> Scenario:
        """A TOML file, or a preset by name (``Scenario.load("home-broadband")``).

        A string ending in ".toml" or holding a path separator is a path; otherwise a
        preset name, or failing that an existing file.
        """
        if isinstance(path_or_name, os.PathLike):
            path = Path(path_or_name)
            return cls.from_toml(_read_file(path), str(path))
        if not isinstance(path_or_name, str):
            raise TypeError(f"Scenario.load: expected a preset name or a path, got {type(path_or_name).__name__}")
        text = path_or_name
        presets = list_presets()
        if not text.endswith(".toml") and "/" not in text and os.sep not in text:
            if text in presets:
                resource = resources.files("exonet.presets").joinpath(f"{text}.toml")
                return cls.from_toml(resource.read_text(encoding="utf-8"), f"scenarios/{text}.toml")
            if not Path(text).is_file():
                raise ScenarioError(
                    f"unknown scenario preset {text!r}{did_you_mean(text, presets)}; presets: {', '.join(presets)} "
                    "(to load a file, give a path ending in .toml)"
                )
        return cls.from_toml(_read_file(Path(text)), text)

    @classmethod
    def from_toml(cls, text: str, source: str = "<toml>") -> Scenario:
        """A scenario from TOML text (what ``load`` reads from a file); an error names the key's line too."""
        raw = parse_toml(text, source)
        try:
            scenario = cls(raw, source)
        except ScenarioError as err:
            raise ScenarioError(with_line(str(err), text, source)) from None
        scenario._text = text
        return scenario

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "<dict>") -> Scenario:
        """A scenario from a dict with the same shape as the TOML."""
        return cls(d, source)

    @classmethod
    def coerce(cls, obj: ScenarioLike) -> Scenario:
        """Whatever a user passed as ``scenario=``: a Scenario, a preset name, a path or a dict."""
        if isinstance(obj, Scenario):
            return obj
        if isinstance(obj, (str, os.PathLike)):
            return cls.load(obj)
        if isinstance(obj, Mapping):
            return cls.from_dict(obj)
        raise TypeError(f"scenario: expected a Scenario, preset name, path or dict, got {type(obj).__name__}")

    @property
    def name(self) -> str:
        return self._parsed["name"]

    @property
    def description(self) -> str:
        return self._parsed.get("description", "")

    @property
    def source(self) -> str:
        return self._source

    @property
    def failures(self) -> FailureSpec | None:
        """The failure process (``[failures]``, SI units), or None; no node count is needed to read it."""
        return FailureSpec(**self._parsed["failures"]) if "failures" in self._parsed else None

    def key_error(self, key: str, message: str) -> ScenarioError:
        """An error about ``key`` (a dotted path, "failures.slice") found after loading, naming the file and,
        when the scenario was read from TOML, the key's line, as the schema's own errors do."""
        text = f"{self._source}: {key}: {message}"
        return ScenarioError(text if self._text is None else with_line(text, self._text, self._source))

    def to_dict(self) -> dict[str, Any]:
        """The scenario as a plain dict (strings with units, as written); ``from_dict`` reads it back."""
        return copy.deepcopy(self._data)

    def replace(self, **changes: Any) -> Scenario:
        """A modified copy, for sweeps: ``s.replace(bandwidth="100 Mbit/s", compute={"mode": "wall"})``.

        Network keys go by name; ``network``/``compute``/``stragglers``/``hosts`` take a dict merged
        into that table (``algorithms`` too, op by op); ``regions``/``links``/``nodes``/``events`` take
        a list that replaces the array; ``name``/``description`` a string. A value of None removes the key.
        ``bandwidth`` means both directions of every NIC: it clears the network's ``uplink`` and
        ``downlink`` unless the same call sets them, and sets each ``[[nodes]]`` entry's own
        ``bandwidth``/``uplink``/``downlink`` to it unless the call sets ``nodes`` (the entries
        stay, with their ranks and speeds: a sweep of home-broadband moves its slow uplinks too).
        """
        data = copy.deepcopy(self._data)
        for key, value in changes.items():
            if key in TABLES and value is not None:
                if not isinstance(value, Mapping):
                    got = type(value).__name__
                    raise ScenarioError(f"replace({key}=...): expected a dict of [{key}] keys, got {got}")
                section = dict(data.get(key, {}))
                for sub, item in value.items():
                    _assign(section, sub, item)
                data[key] = section
            elif key in ("name", "description", *TABLES, *ARRAYS):
                _assign(data, key, value)
            elif key in NETWORK:
                data["network"] = dict(data.get("network", {}))
                _assign(data["network"], key, value)
                if key == "bandwidth" and value is not None:
                    for direction in ("uplink", "downlink"):
                        if direction not in changes:
                            data["network"].pop(direction, None)
                    if "nodes" not in changes and "nodes" in data:
                        data["nodes"] = [{k: value if k in NIC_KEYS else v for k, v in node.items()}
                                         for node in data["nodes"]]
            else:
                valid = ["name", "description", *TABLES, *ARRAYS, *NETWORK]
                hint = did_you_mean(key, valid)
                raise ScenarioError(f"replace(): unknown key {key!r}{hint}; valid: {', '.join(valid)}")
        if "name" not in changes:  # a variant says what changed: "two-region-1g (bandwidth=100 Mbit/s)"
            data["name"] = f"{self.name} ({', '.join(_change_label(k, v) for k, v in changes.items())})"
        return Scenario(data, f"{self._source} + replace({', '.join(changes)})")

    def resolve(self, num_ranks: int | None = None, servers: int = 0, *, num_nodes: int | None = None,
                store: bool = False) -> Resolved:
        """The scenario made concrete for ``num_ranks`` ranks (trainers, then servers), in SI base units.

        With ``store``, the last server is the object store of ``[store]`` (a trace that puts and gets): it sits in
        ``[store] region`` (default rank 0's), its NIC is the store's ``throughput`` each way, and a request to it
        adds ``latency`` and is capped at ``upload`` (to it) or ``download`` (from it).

        The last ``servers`` ranks serve (a parameter server): every ``share`` counts the trainers only,
        so a server never moves a trainer to another region; a server lives in ``[server] region``
        (default: rank 0's region), unless explicit ``ranks`` name it. ``num_nodes=`` is the old keyword
        for ``num_ranks`` (it warns: ``num_nodes`` means the trainers everywhere else).
        """
        if num_nodes is not None:
            if num_ranks is not None:
                raise TypeError("Scenario.resolve: give num_ranks (every rank), not num_nodes as well")
            warnings.warn("Scenario.resolve(num_nodes=...) is now num_ranks= (every rank, trainers and servers)",
                          DeprecationWarning, stacklevel=2)
            num_ranks = num_nodes
        if isinstance(num_ranks, bool) or not isinstance(num_ranks, int) or num_ranks < 1:
            raise ValueError(f"Scenario.resolve: num_ranks must be an integer >= 1, got {num_ranks!r}")
        if isinstance(servers, bool) or not isinstance(servers, int) or not 0 <= servers < num_ranks:
            raise ValueError(f"Scenario.resolve: servers must be an integer in [0, num_ranks), got {servers!r}")
        if store and servers < 1:
            raise ValueError("Scenario.resolve: the store is the last server; give servers >= 1 with store=True")
        p, n, where = self._parsed, num_ranks, f"{self._source}:"
        trainers = n - servers
        net = p["network"]
        efficiency = net.get("efficiency", 1.0)
        latency = net.get("latency", 0.0)
        region = self._regions(n, trainers)
        spec = p.get("store", {})
        if store:
            region[-1] = spec.get("region", region[0])
        links = {
            tuple(sorted(link["between"])): LinkSpec(link["bandwidth"] * efficiency, link.get("latency", latency))
            for link in p.get("links", [])
        }
        egress = self._egress(links)
        present = sorted(set(region), key=region.index)
        for i, a in enumerate(present):
            for b in present[i + 1 :]:
                if tuple(sorted((a, b))) not in links:
                    raise ScenarioError(
                        f"{where} regions {a!r} and {b!r} both hold nodes (num_nodes={n}) but no [[links]] entry "
                        f'joins them; add [[links]] between = ["{a}", "{b}"] with a bandwidth'
                    )
        up = [net.get("uplink", net.get("bandwidth"))] * n
        down = [net.get("downlink", net.get("bandwidth"))] * n
        speed = [1.0] * n
        hosts = self._hosts(trainers, region, efficiency)
        if store:
            up[-1] = down[-1] = spec.get("throughput", STORE_THROUGHPUT) / efficiency  # the store's own rate
        for i, node in enumerate(p.get("nodes", [])):
            ranks = self._ranks(node, f"nodes[{i}]", n, trainers)
            if hosts is not None and hosts.nic == "per-host" and any(k in node for k in NIC_KEYS):
                self._check_host_nic(i, ranks, hosts.devices, trainers)
            for r in ranks:
                up[r] = node.get("uplink", node.get("bandwidth", up[r]))
                down[r] = node.get("downlink", node.get("bandwidth", down[r]))
                speed[r] = node.get("speed", speed[r])
        algorithms = {**FAMILIES[self._collective()], **net.get("algorithms", {})}
        events = tuple(
            EventSpec(e["kind"], self._ranks(e, f"events[{i}]", n, trainers), e.get("from_step"), e.get("to_step"),
                      e.get("from_s"), e.get("to_s"), e.get("factor", 1.0))
            for i, e in enumerate(p.get("events", []))
        )
        compute, strag = p.get("compute", {}), p.get("stragglers", {})
        backend = net.get("backend")
        nccl = self._nccl() if backend == "nccl" else None
        tcp = backend is not None and (nccl is None or nccl.transport == "socket")  # verbs bypass TCP
        return Resolved(
            num_nodes=n,
            uplink=tuple(x * efficiency for x in up),
            downlink=tuple(x * efficiency for x in down),
            region=tuple(region),
            latency=latency,
            links=links,
            egress=egress,
            store=StoreSpec(spec.get("latency", STORE_LATENCY), spec.get("upload"), spec.get("download"),
                            spec.get("throughput", STORE_THROUGHPUT)) if store else None,
            speed=tuple(speed),
            algorithms=algorithms,
            sharing=net.get("sharing", "max-min"),
            tcp_window=net.get("tcp_window", LINUX_WINDOW if tcp else None),
            mss=net.get("mss"),
            header_bytes=net.get("header_bytes", 0.0),
            message_overhead=net.get("message_overhead", 0.0),
            host_cores=net.get("host_cores"),
            group_concurrency=net.get("group_concurrency", 2 if backend == "gloo" else 1),
            queue=net.get("queue"),
            streams=net.get("streams", nccl.channels * nccl.sockets if nccl is not None and tcp else 1),
            setup=net.get("setup", 0.0),
            compute_mode=compute.get("mode", "measured"),
            tflops=compute.get("tflops"),
            mfu=compute.get("mfu", 1.0),
            jitter=strag.get("jitter", "none"),
            sigma=strag.get("sigma", 0.0),
            seed=strag.get("seed", 0),
            events=events,
            name=self.name,
            hosts=hosts,
            failures=FailureSpec(**p["failures"]) if "failures" in p else None,
            servers=servers,
            backend=backend,
            nccl=nccl,
            slow_start=net.get("slow_start_after_idle", tcp),
            flow_rate=net.get("flow_rate", FLOW_RATE.get(nccl.nic) if nccl is not None and tcp else None),
        )

    def _collective(self) -> str:
        """The family of algorithms that runs: a backend's own (``collective`` then picks among its algorithms, see
        ``_nccl``), else ``network.collective``, by default "hierarchical" under ``[hosts]`` and "ring" without."""
        net = self._parsed["network"]
        if "backend" in net:
            return str(net["backend"])
        return str(net.get("collective", "hierarchical" if "hosts" in self._parsed else "ring"))

    def _nccl(self) -> NcclSpec:
        """``[network.nccl]``, with ``collective = "ring" | "tree"`` as its algorithm (NCCL_ALGO said once)."""
        net = self._parsed["network"]
        spec = dict(net.get("nccl", {}))
        if net.get("collective") in NCCL_ALGORITHMS:
            spec["algorithm"] = net["collective"]
        return NcclSpec(**spec)

    def _hosts(self, n: int, region: list[str], efficiency: float) -> HostSpec | None:
        """``[hosts]`` for ``n`` trainer ranks: whole hosts only, each host inside one region.

        Server ranks (after the trainers) are not counted: they fall on hosts of their own.
        """
        h = self._parsed.get("hosts")
        if h is None:
            return None
        g = h["devices"]
        if n % g:
            raise ScenarioError(f"{self._source}: hosts.devices = {g} does not divide num_nodes={n}; "
                                f"a host holds {g} consecutive ranks, so the node count must be a multiple of {g}")
        for first in range(0, n, g):
            inside = sorted(set(region[first : first + g]))
            if len(inside) > 1:
                raise ScenarioError(f"{self._source}: host {first // g} (ranks {first}-{first + g - 1}) spans regions "
                                    f"{', '.join(map(repr, inside))}; a host's devices sit in one region")
        return HostSpec(g, h["bandwidth"] * efficiency, h.get("latency", 0.0), h.get("nic", "per-device"))

    def _check_host_nic(self, i: int, ranks: tuple[int, ...], g: int, trainers: int) -> None:
        """With ``hosts.nic = "per-host"`` a host's devices use its lowest rank's NIC: a ``[[nodes]]`` NIC
        on another of its ranks, without that one, would change nothing, so it is an error."""
        for r in ranks:
            first = r - r % g
            if r < trainers and first not in ranks:
                raise ScenarioError(
                    f"{self._source}: nodes[{i}] sets the NIC of rank {r}, but with hosts.nic = 'per-host' the devices "
                    f"of host {r // g} (ranks {first}-{first + g - 1}) share rank {first}'s NIC, which the entry does "
                    f"not set; give the host's NIC on rank {first} (or every rank of the host)")

    def _ranks(self, entry: Mapping[str, Any], path: str, n: int, trainers: int | None = None) -> tuple[int, ...]:
        """An entry's explicit ranks (range-checked), or the last max(1, round(share·trainers)) trainers."""
        if "ranks" in entry:
            for r in entry["ranks"]:
                if r >= n:
                    where = f"{self._source}: {path}.ranks"
                    raise ScenarioError(f"{where}: rank {r} is out of range for {n} nodes (ranks 0..{n - 1})")
            return entry["ranks"]
        trainers = n if trainers is None else trainers
        k = max(1, _round_half_up(Fraction(entry["share"]) * trainers))
        return tuple(range(trainers - k, trainers))

    def _egress(self, links: Mapping[tuple[str, str], Any]) -> dict[tuple[str, str], float]:
        """$/byte from region a to region b for every joined pair with a price: the link's ``egress``, else a's."""
        p = self._parsed
        by_region = {r["name"]: r["egress"] for r in p.get("regions", []) if "egress" in r}
        by_link = {tuple(sorted(link["between"])): link["egress"] for link in p.get("links", []) if "egress" in link}
        out = {}
        for pair in links:
            for a, b in (pair, pair[::-1]):
                price = by_link.get(pair, by_region.get(a))
                if price:
                    out[(a, b)] = price
        return out

    def _regions(self, n: int, trainers: int) -> list[str]:
        """Each rank's region: share blocks of the trainers laid from rank 0 in order, explicit ranks as given,
        servers in [server] region (or rank 0's), the rest "default"."""
        owner: dict[int, int] = {}
        regions = self._parsed.get("regions", [])
        cumulative = Fraction(0)
        for i, region in enumerate(regions):
            if "share" in region:
                start = min(trainers, _round_half_up(cumulative * trainers))
                cumulative += Fraction(region["share"])
                members: tuple[int, ...] = tuple(range(start, min(trainers, _round_half_up(cumulative * trainers))))
            else:
                members = self._ranks(region, f"regions[{i}]", n, trainers)
            for r in members:
                if r in owner:
                    other = regions[owner[r]]["name"]
                    raise ScenarioError(
                        f"{self._source}: regions[{i}] ({region['name']!r}) and regions[{owner[r]}] ({other!r}) "
                        f"both contain rank {r} (num_nodes={n}); a node belongs to one region"
                    )
                owner[r] = i
        names = [regions[owner[r]]["name"] if r in owner else DEFAULT_REGION for r in range(n)]
        home = self._parsed.get("server", {}).get("region", names[0])
        return [home if r >= trainers and r not in owner else name for r, name in enumerate(names)]

    def describe(self, num_nodes: int | None = None, servers: int = 0) -> str:
        """A readable summary; with ``num_nodes`` (trainers), also the per-rank layout it resolves to, with
        ``servers`` serving ranks after them."""
        family = self._collective()
        preset = self._source.startswith("scenarios/") and " + " not in self._source  # as shipped, unreplaced
        lines = [f"{self.name}: {self.description}" if self.description else self.name, f"  source      {self._source}",
                 *sections(self._parsed, family, self._nccl() if family == "nccl" else None, num_nodes,
                           "preset" if preset else "set")]
        if num_nodes is not None:
            serving = f" and {units.plural(servers, 'server')}" if servers else ""
            lines.append(f"  resolved for {units.plural(num_nodes, 'node')}{serving}:")
            lines.extend(layout(self.resolve(num_nodes + servers, servers)))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Scenario(name={self.name!r}, source={self._source!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scenario) and self._data == other._data

    def __hash__(self) -> int:
        return hash(json.dumps(self._data, sort_keys=True, default=str))

    @property
    def fingerprint(self) -> str:
        """16 hex digits that equal scenarios share, stable across processes (a trace records it)."""
        return hashlib.sha256(json.dumps(self._data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _change_label(key: str, value: Any) -> str:
    """How a ``replace`` change reads in the variant's name: ``bandwidth=100 Mbit/s``, ``compute.mode=wall``."""
    if isinstance(value, Mapping):
        return ", ".join(_change_label(f"{key}.{sub}", item) for sub, item in value.items())
    if isinstance(value, (list, tuple)):
        return f"{key}=[{len(value)} entr{'y' if len(value) == 1 else 'ies'}]"
    return f"{key}={'removed' if value is None else value}"


def _assign(table: dict[str, Any], key: str, value: Any) -> None:
    """Set ``table[key]``, or remove it when ``value`` is None; a dict merges into a table already there
    (``algorithms={"broadcast": "binomial"}`` keeps an earlier variant's ``all_reduce``, as its name says)."""
    if value is None:
        table.pop(key, None)
    elif isinstance(value, Mapping) and isinstance(table.get(key), Mapping):
        merged = dict(table[key])
        for sub, item in value.items():
            _assign(merged, sub, item)
        table[key] = merged
    else:
        table[key] = copy.deepcopy(value)


def _round_half_up(x: Fraction) -> int:
    return math.floor(x + Fraction(1, 2))


# What ``scenario=`` accepts at exonet's doors (fit, simulate, estimate, the solver): coerced there, once.
ScenarioLike = Scenario | str | os.PathLike[str] | Mapping[str, Any]
