"""Calibration: fit the model's free parameters on half the cases, report the error on the other half.

Three models are compared on every case:

* **ideal**: the scenario defaults (protocol efficiency 1, no framing, no host cost,
  the ring family of algorithms), i.e. what a user gets from ``bandwidth = ...`` alone;
* **modelled**: what is known without fitting: TCP/IPv4 framing as Linux ``tbf`` counts it
  (1448 payload bytes per 1514-byte frame: ``mss = 1448``, ``header_bytes = 66``) and
  gloo's algorithms on CPU tensors (ring all-reduce and all-gather, binomial broadcast
  with concurrent sends to the children, exonet's reduce-scatter as a direct all-to-all);
* **calibrated**: the modelled scenario plus two fitted parameters, ``efficiency`` (what
  remains of the bandwidth: ACKs on the reverse path, TCP pacing) and
  ``message_overhead`` (host seconds per message, which plays α here, since the
  namespaces add no propagation delay).

One effect is known and bounded, not modelled (the README's "How accurate is it" says so): gloo
posts a send before the matching receive in all_to_all (exonet's reduce_scatter on gloo) and,
between two ranks, in all_gather, and a receive-ready notice travels on the same TCP stream as
data (gloo's tcp ``Pair``: one FIFO of data and notices per pair), so on a pair whose ranks
entered at different times the second direction waits until the first has drained. Who enters
last is a race, so such a case takes between the modelled time (won) and ``race_bound``'s upper
end (lost). ``covered`` names those cases; they are shown with their interval, never fitted, and
left out of the error bounds.

The fit minimises the absolute log-ratio of simulated to real time over the fitting
half (the median's loss, so a few cases the model misses cannot drag it) (a pattern search
on the two parameters, no SciPy). Halves alternate in matrix order, so both hold every kind
of case.

A user's own measurements (``exonet validate --calibrate --measurements FILE.csv``) are a
CSV with a header and one row per measured case::

    op,nodes,bytes,count,bandwidth,seconds
    all_reduce,4,8000000,1,1 Gbit/s,0.0712
    all_reduce,4,4096,100,1 Gbit/s,0.0290

``op`` is a collective (all_reduce, all_gather, reduce_scatter, broadcast, all_to_all),
``bytes`` the payload each rank passes in (as exonet's trace counts it), ``count`` how
many such collectives ran back to back in the timed span, ``bandwidth`` each NIC's rate,
``seconds`` the measured time of the whole span (a median of repeats).

Optional columns describe the link the way ``[network]`` does, and are set, not fitted:
``latency`` (one way, e.g. ``25 ms``), ``streams`` (TCP connections per transfer), ``queue``
(``345 KB`` or ``50 ms``) and ``tcp_window`` (``6 MiB``). A column ``first`` (1 or 0) marks
spans that began with a new process group's first collective. Those rows fit ``setup``, the
one-time cost of that first collective, as the median of (measured − simulated without it).
The other rows are simulated without it, because they were timed after a warm-up. ``setup``
and the link's columns, where every row gives the same value, go into the scenario file that
``--calibrate`` writes. A recorded run's own collective timings serve as measurements too
(``exonet validate --calibrate --run RUN_DIR --bandwidth ...``; exonet.validate.runs).
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from exonet import units
from exonet.errors import ScenarioError
from exonet.scenario import Scenario
from exonet.trace import OPS, Trace
from exonet.validate.cases import Case, Measurement

# What gloo runs for each op exonet issues on CPU tensors (see the module docstring).
GLOO_ALGORITHMS = {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "direct",
                   "broadcast": "binomial_fanout", "all_to_all": "direct"}
TCP_FRAMING = {"mss": 1448, "header_bytes": 66}  # MTU 1500, TCP timestamps, Ethernet header (what tbf counts)
RACE_SLACK = 0.05  # a race case counts as inside its interval within this much (the timing's own spread)
PARAMS = ("efficiency", "message_overhead")
BOUNDS = {"efficiency": (0.5, 1.0), "message_overhead": (0.0, 0.05)}


def ideal() -> Scenario:
    return Scenario.from_dict({"name": "ideal", "network": {"bandwidth": "1 Gbit/s"}})


def modelled(efficiency: float = 1.0, message_overhead: float = 0.0, host_cores: float | None = None,
             name: str = "modelled", setup: float = 0.0) -> Scenario:
    """The scenario with the known physics, and the free parameters set.

    ``host_cores``: the cores every node shares when they all run on one machine (None: a host each).
    ``setup``: seconds a process group's first collective waits (fitted from ``first`` rows).
    """
    network: dict[str, Any] = {"bandwidth": "1 Gbit/s", **TCP_FRAMING, "algorithms": dict(GLOO_ALGORITHMS)}
    if setup:
        network["setup"] = f"{setup:.6g} s"
    if efficiency != 1.0:
        network["efficiency"] = efficiency
    if message_overhead:
        network["message_overhead"] = f"{message_overhead * 1e6:.6g} us"
        if host_cores is not None:
            network["host_cores"] = host_cores
    return Scenario.from_dict({"name": name, "network": network})


def covered(case: Case) -> bool:
    """Whether the model claims this case: not an all_to_all, nor an all_gather between two ranks
    (where gloo posts a send before its receive; see the module docstring)."""
    pairs = case.nodes == 2 or case.regions and case.nodes == 4
    if case.kind == "train":
        return True
    return case.op not in ("reduce_scatter", "all_to_all") and not (pairs and case.op == "all_gather")


def race_bound(case: Case, won: float) -> tuple[float, float] | None:
    """(won, lost): the interval gloo's send-before-receive race leaves an unmodelled case in, from its
    modelled time ``won``; None for a covered case.

    all_to_all (and exonet's reduce_scatter on gloo) posts its send to rank r + i before its receive
    from r − i, so when one rank enters late, ⌊K/2⌋ of its K − 1 pairs carry their two directions one
    after the other: at most won · (1 + ⌊K/2⌋ / (K − 1)), twice at K = 2. all_gather between two ranks
    posts both of its half-chunk sends before their receives: the late rank's data drains first, at
    most 1.5 · won.
    """
    if covered(case) or case.kind != "collective":
        return None
    k = 2 if case.regions else case.nodes
    lost = won * (1.5 if case.op == "all_gather" else 1.0 + (k // 2) / (k - 1))
    return won, lost


def host_bound(case: Case) -> bool:
    """Bursts of small collectives: their time is the hosts' per-message cost, not the network's."""
    return case.kind == "burst"


@dataclass
class Row:
    """One case's real and simulated seconds, which half it is in, and whether the model covers it."""

    name: str
    real: float
    ideal: float
    modelled: float
    calibrated: float
    held_out: bool
    covered: bool = True
    host_bound: bool = False
    race: tuple[float, float] | None = None  # an unmodelled case's (won, lost) interval, from ``calibrated``

    @property
    def in_race(self) -> bool:
        """Whether the real time lies in the race's interval (within ``RACE_SLACK``)."""
        return self.race is not None and self.race[0] * (1 - RACE_SLACK) <= self.real <= self.race[1] * (1 + RACE_SLACK)

    @staticmethod
    def error(sim: float, real: float) -> float:
        return (sim - real) / real


@dataclass
class Calibration:
    """Fitted parameters and the per-case comparison."""

    params: dict[str, Any]  # efficiency, message_overhead (fitted) and host_cores (given, or None)
    rows: list[Row]
    source: str = ""  # where the parameters came from when they were not fitted here (a preset's name)

    def scenario(self) -> Scenario:
        p = self.params
        return modelled(p["efficiency"], p["message_overhead"], p.get("host_cores"), name="calibrated",
                        setup=p.get("setup", 0.0)).replace(**p.get("link", {}))

    def summary(self, which: str, held_out: bool | None = True, host_bound: bool | None = None) -> tuple[float, float]:
        """(median |error|, worst |error|) of one model's column over the covered cases of the held-out half
        (or the fit half, or all with None), optionally only the host-bound (True) or bandwidth-bound (False) ones."""
        errs = [abs(Row.error(getattr(r, which), r.real)) for r in self.rows
                if r.covered and (held_out is None or r.held_out == held_out)
                and (host_bound is None or r.host_bound == host_bound)]
        return (statistics.median(errs), max(errs)) if errs else (math.nan, math.nan)

    def table(self) -> str:
        """A Markdown table of every case and the held-out summary."""
        out = ["| case | half | real s | ideal s | err | modelled s | err | calibrated s | err |",
               "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in self.rows:
            side = self.source or ("held-out" if r.held_out else "fit")
            if r.race is not None:
                side = f"race {r.race[0]:.4g}-{r.race[1]:.4g} s: {'inside' if r.in_race else 'outside'}"
            cells = [r.name, "unmodelled" if not r.covered and r.race is None else side, f"{r.real:.4g}"]
            for col in ("ideal", "modelled", "calibrated"):
                sim = getattr(r, col)
                cells += [f"{sim:.4g}", f"{Row.error(sim, r.real):+.1%}"]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        halves = ((True, "held-out"), (False, "fit half")) if not self.source else ((True, f"with {self.source}"),)
        for half, label in halves:
            for bound, which in ((None, "all covered"), (False, "bandwidth-bound"), (True, "host-bound")):
                parts = []
                for col in ("ideal", "modelled", "calibrated"):
                    med, worst = self.summary(col, half, bound)
                    parts.append(f"{col} median |err| {med:.1%}, worst {worst:.1%}")
                out.append(f"{label}, {which}: " + "; ".join(parts))
        races = [r for r in self.rows if r.race is not None]
        if races:
            inside = sum(r.in_race for r in races)
            out.append(f"gloo's send-before-receive race (unmodelled, bounded): {inside} of {len(races)} cases "
                       f"inside [won, lost] (within {RACE_SLACK:.0%})")
        p = self.params
        cores = f", host_cores = {p['host_cores']:g}" if p.get("host_cores") is not None else ""
        setup = f", setup = {p['setup']:.4g} s" if "setup" in p else ""
        link = "".join(f", {key} = {value}" for key, value in p.get("link", {}).items())
        out.append(f"{'parameters of ' + self.source if self.source else 'fitted'}: "
                   f"efficiency = {p['efficiency']:.4f}, "
                   f"message_overhead = {p['message_overhead'] * 1e6:.1f} us{setup} "
                   f"(with mss = {TCP_FRAMING['mss']}, header_bytes = {TCP_FRAMING['header_bytes']}{cores}{link})")
        return "\n".join(out)

    def to_toml(self, name: str = "calibrated-loopback", description: str | None = None) -> str:
        """The calibrated scenario as a preset file; set ``bandwidth`` (or ``replace(bandwidth=...)``) for the link."""
        p = self.params
        desc = description or ("exonet validate's fit: gloo between network namespaces shaped by htb, every node "
                               "on this machine's cores; replace(bandwidth=...) sets the shaped rate")
        algos = "\n".join(f'{op} = "{algo}"' for op, algo in GLOO_ALGORITHMS.items())
        cores = f"host_cores = {p['host_cores']:g}\n" if p.get("host_cores") is not None else ""
        setup = f'setup = "{p["setup"]:.4g} s"\n' if p.get("setup") else ""
        link = "".join(f"{key} = {value}\n" if isinstance(value, int) else f'{key} = "{value}"\n'
                       for key, value in p.get("link", {}).items())
        return (f'name = "{name}"\ndescription = "{desc}"\n\n[network]\nbandwidth = "1 Gbit/s"\n'
                f"mss = {TCP_FRAMING['mss']}\nheader_bytes = {TCP_FRAMING['header_bytes']}\n"
                f"efficiency = {p['efficiency']:.4f}\n"
                f"message_overhead = \"{p['message_overhead'] * 1e6:.1f} us\"\n{cores}{setup}{link}\n"
                f"[network.algorithms]\n{algos}\n")


def split(measurements: Sequence[Measurement]) -> list[bool]:
    """Which cases are held out: every other covered case of each kind (op, or training), in matrix order,
    so both halves hold bursts, each op and training runs alike (the first of each kind is fitted)."""
    held: list[bool] = []
    seen: dict[tuple[str, bool], int] = {}  # (kind, first) -> covered cases seen
    for m in measurements:
        kind = (m.case.kind if m.case.kind != "collective" else m.case.op, _first(m))
        k = seen.get(kind, 0)
        held.append(k % 2 == 1)
        seen[kind] = k + covered(m.case)
    return held


def _loss(measurements: Sequence[Measurement], eff: float, overhead: float, host_cores: float | None) -> float:
    scen = modelled(eff, overhead, host_cores)
    return sum(abs(math.log(m.simulate(scen) / m.real)) for m in measurements)


def _first(m: Measurement) -> bool:
    return getattr(m, "first", False)


def fit(measurements: Sequence[Measurement], host_cores: float | None = None) -> dict[str, Any]:
    """(efficiency, message_overhead) by pattern search on the steady rows, then ``setup`` from the ``first`` rows.

    The search minimises the absolute log error (robust to outliers). ``setup`` is the median of
    what the first rows took beyond the fitted model (0 without first rows).
    """
    if not measurements:
        raise ValueError("calibrate: no cases to fit")
    steady = [m for m in measurements if not _first(m)] or list(measurements)
    params = _fit_rates(steady, host_cores)
    firsts = [m for m in measurements if _first(m)]
    if firsts:
        scen = modelled(params["efficiency"], params["message_overhead"], host_cores)
        params["setup"] = max(0.0, statistics.median(m.real - m.simulate(scen) for m in firsts))
    links = [getattr(m, "link", {}) for m in measurements]
    if links and all(link == links[0] for link in links) and links[0]:
        params["link"] = dict(links[0])
    return params


def _fit_rates(measurements: Sequence[Measurement], host_cores: float | None) -> dict[str, Any]:
    x = [0.95, 1e-4]
    steps = [0.02, 2e-4]
    best = _loss(measurements, x[0], x[1], host_cores)
    while steps[0] > 1e-4 or steps[1] > 1e-7:
        improved = False
        for i in range(2):
            for sign in (1, -1):
                y = list(x)
                lo, hi = BOUNDS[PARAMS[i]]
                y[i] = min(hi, max(lo, x[i] + sign * steps[i]))
                loss = _loss(measurements, y[0], y[1], host_cores)
                if loss < best - 1e-15:
                    x, best, improved = y, loss, True
        if not improved:
            steps = [s / 2 for s in steps]
    return {"efficiency": x[0], "message_overhead": x[1], "host_cores": host_cores}


def compare(measurements: Sequence[Measurement], params: dict[str, Any], held: Sequence[bool],
            source: str = "") -> Calibration:
    """Every case under the ideal, modelled and calibrated (``params``, from ``source`` if not fitted here)."""
    calib_s = modelled(params["efficiency"], params["message_overhead"], params.get("host_cores"),
                       setup=params.get("setup", 0.0))
    ideal_s, model_s = ideal(), modelled()
    rows = []
    for m, h in zip(measurements, held):
        calibrated = m.simulate(calib_s)
        rows.append(Row(m.case.name + (" (first)" if _first(m) else ""), m.real, m.simulate(ideal_s),
                        m.simulate(model_s), calibrated, h, covered(m.case), host_bound(m.case),
                        race_bound(m.case, calibrated)))
    return Calibration(dict(params), rows, source)


def calibrate(measurements: Sequence[Measurement], host_cores: float | None = None) -> Calibration:
    """Fit on one half of the covered cases and compare every case, the other half held out.

    ``host_cores``: the cores all nodes shared when measured (namespaces on one machine), else None.
    """
    held = split(measurements)
    fitting = [m for m, h in zip(measurements, held) if not h and covered(m.case)]
    return compare(measurements, fit(fitting, host_cores), held)


def preset_params(name: str = "calibrated-loopback") -> dict[str, Any]:
    """The fitted parameters a calibrated preset carries."""
    net = Scenario.load(name).to_dict()["network"]
    overhead = net.get("message_overhead", 0.0)
    return {"efficiency": float(net.get("efficiency", 1.0)), "host_cores": net.get("host_cores"),
            "message_overhead": units.parse_time(overhead, f"{name}: network.message_overhead")}


# ---------------------------------------------------------------- a user's own measurements
def burst_trace(op: str, nodes: int, nbytes: int, count: int) -> Trace:
    """``count`` back-to-back collectives of ``nbytes`` on every rank, nothing else."""
    t = Trace(nodes)
    for rank in range(nodes):
        for _ in range(count):
            t.add_collective(rank, op, nbytes)
    return t


@dataclass
class Measured(Measurement):
    """A row of a user's measurements file: a case, its link's own ``[network]`` keys, and whether
    it began with a group's first collective (then it pays the scenario's ``setup``)."""

    link: dict[str, Any] = field(default_factory=dict)
    first: bool = False

    def simulate(self, scenario: Scenario) -> float:
        return super().simulate(scenario.replace(**self.link, **({} if self.first else {"setup": None})))


LINK_COLUMNS = ("latency", "streams", "queue", "tcp_window")


def link_value(key: str, value: str) -> Any:
    """A link key's value as written ("25 ms", "16"), with ``streams`` as the integer the scenario wants."""
    return int(value) if key == "streams" and value.isdigit() else value


def read_measurements(path: str | Path) -> list[Measurement]:
    """Measurements from a CSV in the format of the module docstring; errors name the file and line."""
    path = Path(path)
    need = ("op", "nodes", "bytes", "count", "bandwidth", "seconds")
    out: list[Measurement] = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in need if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; expected a header {','.join(need)}")
        for line, row in enumerate(reader, start=2):
            where = f"{path}:{line}"
            try:
                op, nodes, nbytes, count = row["op"], int(row["nodes"]), int(row["bytes"]), int(row["count"])
                bandwidth = units.parse_rate(row["bandwidth"], f"{where}: bandwidth") * 8
                seconds = float(row["seconds"])
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}: {exc}") from None
            if op not in OPS:
                raise ValueError(f"{where}: op must be one of {', '.join(OPS)}, got {op!r}")
            if nodes < 2 or nbytes < 0 or count < 1 or not seconds > 0:
                raise ValueError(f"{where}: expected nodes >= 2, bytes >= 0, count >= 1 and seconds > 0")
            link: dict[str, Any] = {}
            for key in LINK_COLUMNS:
                value = (row.get(key) or "").strip()
                if value:
                    link[key] = link_value(key, value)
            first = (row.get("first") or "0").strip()
            if first not in ("0", "1"):
                raise ValueError(f"{where}: first must be 0 or 1, got {first!r}")
            case = Case("burst" if count > 1 else "collective", nodes, bandwidth, op, nbytes, count, repeats=1)
            m = Measured(case, [seconds], [burst_trace(op, nodes, nbytes, count)], link, first == "1")
            try:
                m.simulate(ideal())  # the link's values are checked as the scenario checks them
            except ScenarioError as exc:
                raise ValueError(f"{where}: {exc}") from None
            out.append(m)
    if not out:
        raise ValueError(f"{path}: no measurements")
    return out


def write_measurements(measurements: Sequence[Measurement], path: str | Path) -> Path:
    """The homogeneous collective cases as a measurements CSV (the format ``read_measurements`` reads)."""
    path = Path(path)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(("op", "nodes", "bytes", "count", "bandwidth", "seconds", *LINK_COLUMNS, "first"))
        for m in measurements:
            c, link = m.case, getattr(m, "link", {})
            if c.kind != "train" and not c.hetero and not c.regions:
                w.writerow((c.op, c.nodes, c.nbytes, c.count, f"{c.bandwidth:g} bit/s", f"{m.real:.6g}",
                            *(link.get(key, "") for key in LINK_COLUMNS), int(_first(m))))
    return path
