"""The events of a trace, and the checks every event passes whether built by hand or read from a file."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Union

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "reduce", "gather", "scatter",
       "barrier")
P2P_OPS = ("send", "recv")
STORE_OPS = ("put", "get")  # an object store between peers: a key's bytes go up once, and down to each reader
MAX_KEY = 1024  # characters of a store key
MAX_SECONDS = 1e15  # a compute span longer (about 30 million years) is corrupt, and sums of such overflow
MAX_BYTES = (1 << 63) - 1  # a payload is a tensor's byte count, an int64
MAX_PAYLOAD = 1 << 50  # 1 PiB: more than any collective moves, and its time in ticks stays small enough to solve


@dataclass(slots=True)
class Compute:
    """Local work between communications.

    Events are plain slotted records, read-only by convention (traces share event objects between
    ranks and copies; events are not hashable): a frozen dataclass costs 1.8 µs to build against
    0.2 µs, and the Communicator builds two on every collective.
    """

    wall_s: float
    cpu_s: float
    flops: float = 0.0


@dataclass(slots=True)
class Collective:
    """One collective issued by one rank. ``nbytes`` is the payload this rank passes in.

    A store op (``put``/``get``) has no group and names its ``key``: a get reads what the put of that key wrote.
    """

    cid: int
    op: str
    nbytes: int
    group: tuple[int, ...] | None = None
    async_op: bool = False
    dtype: str = "float32"
    start_s: float | None = None
    end_s: float | None = None
    key: str | None = None


@dataclass(slots=True)
class Wait:
    """The rank blocks until its own async collective ``cid`` has finished."""

    cid: int


@dataclass(slots=True)
class Step:
    """End of a training step on this rank."""


@dataclass(slots=True)
class Discard:
    """The rank's work since its last sync is lost (it adopts the state of nodes that stayed up)."""


Event = Union[Compute, Collective, Wait, Step, Discard]
STEP = Step()
DISCARD = Discard()


def checked_compute(wall_s: Any, cpu_s: Any, flops: Any) -> Compute:
    """A compute span, each value checked (``Trace.add_compute`` and a file's reader alike)."""
    return Compute(_seconds("seconds", wall_s), _seconds("cpu_s", cpu_s), _seconds("flops", flops, math.inf))


def checked_collective(rank: int, num_nodes: int, cid: Any, op: Any, nbytes: Any, group: Any, async_op: bool,
                       dtype: Any,
                       start_s: Any, end_s: Any, key: Any = None) -> Collective:
    """A collective, each value checked (``Trace.add_collective`` and a file's reader alike)."""
    if op not in OPS and op not in P2P_OPS and op not in STORE_OPS:
        raise ValueError(f"op must be one of {', '.join(OPS + P2P_OPS + STORE_OPS)}, got {op!r}")
    if op in STORE_OPS:
        if group is not None:
            raise ValueError(f"a {op} goes to the object store: it takes no group, got {group!r}")
        if not isinstance(key, str) or not key or len(key) > MAX_KEY or not key.isprintable():
            raise ValueError(f"a {op} needs its key, a printable string of 1 to {MAX_KEY} characters, got {key!r}")
    elif key is not None:
        raise ValueError(f"only put and get name a key; a {op} has none, got {key!r}")
    if op in P2P_OPS and (group is None and num_nodes != 2 or group is not None and len(group) != 2):
        raise ValueError(f"a {op} needs its group to be the pair (sender, receiver), got {group!r}")
    if not isinstance(dtype, str) or not dtype:
        raise TypeError(f"dtype must be a non-empty string such as 'float32', got {dtype!r}")
    grp = _normalise_group(group, num_nodes)
    if grp is not None and rank not in grp:
        raise ValueError(f"rank {rank} is not a member of group {grp}")
    size = checked_integer("nbytes", nbytes)
    if size > MAX_PAYLOAD:
        raise ValueError(f"nbytes must be at most 2**50 (1 PiB), the largest payload exonet simulates, got {nbytes!r}")
    return Collective(checked_integer("cid", cid), op, size, grp, async_op, dtype,
                      _time_stamp("start_s", start_s), _time_stamp("end_s", end_s), key)


def _normalise_group(group: Any, num_nodes: int) -> tuple[int, ...] | None:
    """A group as one canonical value: sorted ranks, or None for the whole world (however it was spelt).

    Order carries no meaning (the group's members are a set), so ``[1, 0]`` is ``(0, 1)`` and
    ``[0, ..., K-1]`` is None; then equal groups compare equal wherever collectives are matched.
    """
    if group is None:
        return None
    if isinstance(group, (str, bytes)) or not isinstance(group, (list, tuple, range)):
        raise TypeError(f"group must be a list of ranks or null, got {group!r}")
    if not all(isinstance(r, (int, numbers.Integral)) and not isinstance(r, bool) for r in group):
        raise TypeError(f"group must list integer ranks, got {group!r}")
    grp = tuple(sorted(int(r) for r in group))
    twice = [a for a, b in zip(grp, grp[1:]) if a == b]
    outside = [r for r in grp if not 0 <= r < num_nodes]
    problems = (["it is empty"] if not grp
                else [f"rank {r} twice" for r in twice[:1]] + [f"rank {r} is outside" for r in outside[:1]])
    if problems:
        raise ValueError(f"group must be distinct ranks in [0, {num_nodes}), got {list(group)} ({', '.join(problems)})")
    return None if len(grp) == num_nodes else grp


def _seconds(name: str, value: Any, limit: float = MAX_SECONDS) -> float:
    """A finite, non-negative number of seconds (or FLOPs, with no limit): what a compute span is made of."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    x = _finite(value)
    if x is None or x < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
    if x > limit:
        raise ValueError(f"{name} must be at most {limit:g}, got {value!r}")
    return x


def _finite(value: int | float) -> float | None:
    """``value`` as a float, or None when it is NaN, infinite or an int too large for a float."""
    try:
        x = float(value)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def checked_integer(name: str, value: Any) -> int:
    """A non-negative integer below 2**63 (an integral float such as 4.0 counts; a bool does not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, numbers.Integral)):
        raise TypeError(f"{name} must be a non-negative integer, got {value!r}")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    number = value if isinstance(value, (int, float)) else int(value)  # an Integral (numpy's) compares as its int
    if number < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if number > MAX_BYTES:
        raise ValueError(f"{name} must be below 2**63, got {value!r}")
    return int(number)


def _time_stamp(name: str, value: Any) -> float | None:
    if value is None:
        return None
    x = None if isinstance(value, bool) or not isinstance(value, (int, float)) else _finite(value)
    if x is None:
        raise ValueError(f"{name} must be a finite number of seconds or null, got {value!r}")
    return x


def coalesced(events: list[Event]) -> list[Event]:
    """``events`` with every run of adjacent compute spans merged into one (seconds, CPU seconds and FLOPs
    summed). A replay times a span by its work at the rank's per-step speed and jitter, through any outage
    window, so a run of spans takes what their sum takes: the same trace, fewer events to replay."""
    out: list[Event] = []
    run: list[Compute] = []
    for e in [*events, None]:
        if type(e) is Compute:
            run.append(e)
            continue
        if len(run) > 1:
            out.append(Compute(sum(c.wall_s for c in run), sum(c.cpu_s for c in run), sum(c.flops for c in run)))
        else:
            out += run
        run = []
        if e is not None:
            out.append(e)
    return out
