"""Scenario: a network and compute environment to replay a trace in (parsed from TOML or a dict).

``Scenario`` is the user-facing description (units as strings, presets by name);
``Resolved`` is the same scenario made concrete for a given node count, in SI base
units, which is all the simulator reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LinkSpec:
    """An inter-region link: shared by all flows crossing it, each direction."""

    bandwidth: float  # bytes/s, each direction, efficiency applied
    latency: float  # seconds, one-way; replaces the node latency for pairs across it


@dataclass(frozen=True)
class EventSpec:
    """A transient slowdown ("slow", compute time x factor) or outage ("down") of some ranks."""

    kind: str  # "slow" | "down"
    ranks: tuple[int, ...]
    from_step: int | None = None
    to_step: int | None = None  # exclusive
    from_s: float | None = None
    to_s: float | None = None  # exclusive
    factor: float = 1.0


@dataclass(frozen=True)
class Resolved:
    """A scenario made concrete for ``num_nodes`` ranks; every quantity in SI base units.

    Attributes:
        uplink / downlink: per-rank NIC rates in bytes/s (efficiency applied).
        region: per-rank region name ("default" when the scenario has no regions).
        latency: default one-way node-to-node latency in seconds.
        links: inter-region links keyed by the sorted pair of region names.
        speed: per-rank relative compute throughput (compute time / speed).
        algorithms: op name -> algorithm name, for every op in exonet.trace.OPS.
        sharing: "max-min" or "fifo".
        tcp_window: bytes, or None; a flow's rate is capped at window / (2 * latency of its path).
        compute_mode: "measured" | "wall" | "flops"; tflops and mfu serve "flops".
        jitter: "none" | "lognormal" | "normal" | "exponential"; sigma its spread; seed its RNG seed.
        events: transient slowdowns and outages.
    """

    num_nodes: int
    uplink: tuple[float, ...]
    downlink: tuple[float, ...]
    region: tuple[str, ...]
    latency: float
    links: dict[tuple[str, str], LinkSpec] = field(default_factory=dict)
    speed: tuple[float, ...] = ()
    algorithms: dict[str, str] = field(default_factory=dict)
    sharing: str = "max-min"
    tcp_window: float | None = None
    compute_mode: str = "measured"
    tflops: float | None = None
    mfu: float = 1.0
    jitter: str = "none"
    sigma: float = 0.0
    seed: int = 0
    events: tuple[EventSpec, ...] = ()

    def path_latency(self, src: int, dst: int) -> float:
        """One-way latency between two ranks (the inter-region link's when they are in different regions)."""
        a, b = self.region[src], self.region[dst]
        if a == b:
            return self.latency
        return self.links[tuple(sorted((a, b)))].latency
