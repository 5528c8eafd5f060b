"""What bandwidth reaches a compute utilisation: ``exonet estimate --solve-utilization``, in Python.

The varied bandwidth is every NIC (``solve_for="nic"``), one inter-region link (``"link"`` for a
scenario's only one, ``"link:A/B"``), a named set of links set alike (``"link:A/B,B/C"``), or every
inter-region link alike (``"links"``). Utilisation never falls as bandwidth grows, so a bisection
in log-bandwidth finds the lowest that reaches a target (``lowest_bandwidth``, usable with any
monotone function). When none does, ``what_bounds`` says what does: the bandwidth left fixed (the
NICs, or links not varied, named with their rates), or, when everything at once would not reach it
either, latency, the TCP window, set-up or uneven compute.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from exonet.estimate import Estimate, simulate_estimate
from exonet.scenario import Scenario, ScenarioLike
from exonet.trace import Trace

SOLVE_FOR = "nic|link|link:A/B[,C/D...]|links"
HIGH = 1e15  # bit/s: "any bandwidth" for the bisection's upper end and what_bounds


def _links(scenario: Scenario) -> list[tuple[str, str]]:
    return [tuple(sorted(link["between"])) for link in scenario.to_dict().get("links", [])]  # type: ignore[misc]


def links_named(scenario: ScenarioLike, solve_for: str) -> list[tuple[str, str]]:
    """The region pairs ``solve_for`` names (module docstring); ``"nic"`` names none.

    Raises:
        ScenarioError: the scenario has no such link, or ``"link"`` is ambiguous (naming its links).
        ValueError: ``solve_for`` is none of the forms.
    """
    from exonet.errors import ScenarioError
    from exonet.scenario.schema import did_you_mean

    chosen = Scenario.coerce(scenario)
    links = _links(chosen)
    names = ["/".join(pair) for pair in links]
    if solve_for == "nic":
        return []
    if solve_for == "links":
        if not links:
            raise ScenarioError(f"--solve-for links: scenario {chosen.name!r} has no inter-region links")
        return links
    if solve_for != "link" and not solve_for.startswith("link:"):
        raise ValueError(f"--solve-for: expected {SOLVE_FOR} (region names), got {solve_for!r}")
    _, _, wanted = solve_for.partition(":")
    if not wanted:
        if len(links) != 1:
            raise ScenarioError(f"--solve-for link: scenario {chosen.name!r} has {len(links)} inter-region links, "
                                f"name them as link:A/B[,C/D] or give links ({', '.join(names) or 'it has none'})")
        return links
    out = []
    for item in wanted.split(","):
        pair = tuple(sorted(part.strip() for part in item.split("/")))
        if len(pair) != 2 or pair not in links:
            raise ScenarioError(f"--solve-for {solve_for}: scenario {chosen.name!r} has no link between "
                                f"{' and '.join(pair)}{did_you_mean('/'.join(pair), names)}; "
                                f"its links: {', '.join(names) or 'none'}")
        out.append(pair)
    return out  # type: ignore[return-value]


def with_bandwidth(scenario: ScenarioLike, bandwidth: float, solve_for: str = "nic") -> Scenario:
    """``scenario`` with what ``solve_for`` names (every NIC, or those links) at ``bandwidth`` bit/s."""

    chosen = Scenario.coerce(scenario)
    rate = f"{bandwidth!r} bit/s"
    if solve_for == "nic":
        return chosen.replace(bandwidth=rate)
    pairs = set(links_named(chosen, solve_for))
    links = [dict(link, bandwidth=rate) if tuple(sorted(link["between"])) in pairs else link
             for link in chosen.to_dict()["links"]]
    return chosen.replace(links=links)


def utilization_at(trace: Trace | Estimate, scenario: ScenarioLike, bandwidth: float, solve_for: str = "nic") -> float:
    """Compute utilisation of an estimate in ``scenario`` with what ``solve_for`` names at ``bandwidth`` bit/s."""
    return simulate_estimate(trace, with_bandwidth(scenario, bandwidth, solve_for)).utilization


def lowest_bandwidth(utilization: Callable[[float], float], target: float, *, low: float, high: float,
                     rtol: float = 0.01) -> float | None:
    """The lowest bandwidth in [low, high] (within ``rtol``) at which ``utilization(bandwidth)`` reaches ``target``.

    ``utilization`` must never fall as bandwidth grows; a bisection in log-bandwidth then finds it.
    Returns None when even ``high`` does not reach it.
    """
    if utilization(high) < target:
        return None
    if utilization(low) >= target:
        return low
    while high / low > 1 + rtol:
        mid = math.sqrt(low * high)
        low, high = (low, mid) if utilization(mid) >= target else (mid, high)
    return high


def bandwidth_for_utilization(trace: Trace | Estimate, scenario: ScenarioLike, target: float, *, solve_for: str = "nic",
                              low: float = 1e3, high: float = HIGH, rtol: float = 0.01) -> float | None:
    """The lowest bandwidth (bit/s, within ``rtol``) of what ``solve_for`` names at which an estimate reaches
    ``target`` compute utilisation; None when no bandwidth of it does (``what_bounds`` says why)."""
    if not 0 < target < 1:
        raise ValueError(f"--solve-utilization: each target must be in (0, 1), got {target}")
    with_bandwidth(scenario, high, solve_for)  # a link the scenario lacks is an error before any replay
    return lowest_bandwidth(lambda bw: utilization_at(trace, scenario, bw, solve_for), target, low=low, high=high,
                            rtol=rtol)


def what_bounds(trace: Trace | Estimate, scenario: ScenarioLike, target: float, solve_for: str = "nic") -> str:
    """Why no bandwidth of what ``solve_for`` names reaches ``target``: the bandwidth left fixed that, freed as
    well, would reach it (the other links first, then the NICs), named with its rate; else the terms that no
    bandwidth moves."""

    chosen = Scenario.coerce(scenario)
    varied = set(links_named(chosen, solve_for))
    fixed = [pair for pair in _links(chosen) if pair not in varied]
    free = with_bandwidth(chosen, HIGH, solve_for)
    links_freed = with_bandwidth(free, HIGH, "link:" + ",".join("/".join(p) for p in fixed)) if fixed else None
    nics_freed = with_bandwidth(free, HIGH, "nic") if solve_for != "nic" else None
    rates = {tuple(sorted(link["between"])): link.get("bandwidth") for link in chosen.to_dict().get("links", [])}
    links_named_ = " and ".join(f"the {'/'.join(p)} link{_at(rates.get(p))}" for p in fixed)
    nics_named = f"the NICs{_at(chosen.to_dict()['network'].get('bandwidth'))}"
    candidates = [(links_freed, links_named_), (nics_freed, nics_named)]
    if links_freed is not None and nics_freed is not None:
        candidates.append((with_bandwidth(links_freed, HIGH, "nic"), f"{nics_named} and {links_named_}"))
    for freed, named in candidates:
        if freed is not None and simulate_estimate(trace, freed).utilization >= target:
            return f"{named} bound it (vary them too: --solve-for links, or nic)"
    return "latency, the TCP window, set-up or uneven compute bound it, not bandwidth"


def _at(rate: Any) -> str:
    """' at 10 Gbit/s' for a scenario's rate as written (a string or bytes/s), '' when it has none."""
    from exonet.units import format_rate, parse_rate

    if rate is None:
        return ""
    return f" at {format_rate(parse_rate(rate, 'bandwidth') if isinstance(rate, str) else float(rate))}"
