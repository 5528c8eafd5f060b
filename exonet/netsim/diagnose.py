"""Why a replay cannot finish: which rank waits where, and what its missing peers do instead.

A trace whose collectives or messages never match (a rank skips one, two ranks wait on each
other) ends the replay with ranks still blocked; these functions turn that state into the
``TraceError`` message a person can act on.
"""

from __future__ import annotations

from collections.abc import Sequence

from exonet.netsim.state import Instance, RankState


def deadlock(ranks: Sequence[RankState], unmatched: Sequence[Instance], everyone: tuple[int, ...]) -> str:
    """What each stuck rank is blocked on, and why its peers never get there (the input has ended).

    ``unmatched`` are the collectives still waiting for members; the first one is named when no
    rank is blocked (every rank ran out of events with something still open).
    """
    lines = []
    for rk in ranks:
        c = rk.blocked
        if c is not None and not c.done:
            lines.append(f"rank {rk.rank} waits in {describe(c, ranks, everyone)}")
    if not lines:
        lines.append(describe(unmatched[0], ranks, everyone))
    return "trace: collectives must match across the group's members, and these never can: " + "; ".join(lines)


def where(c: Instance, everyone: tuple[int, ...]) -> str:
    """``c`` for people: its op, index and group (or the direction of a message)."""
    group, k = c.key
    if c.op == "any":
        return f"a receive from any rank on rank {c.members[0]}"
    if c.op == "p2p":
        return f"message #{k} from rank {c.members[0]} to rank {c.members[1]}"
    return f"{c.op} #{k} on {'all ranks' if group is everyone else f'group {list(group)}'}"


def describe(c: Instance, ranks: Sequence[RankState], everyone: tuple[int, ...]) -> str:
    """``c``, who issued it, and what each member that did not is doing instead."""
    missing = [r for r in c.members if r not in c.ranks]
    if not missing:
        return where(c, everyone)
    reasons = []
    for r in missing:
        other = ranks[r].blocked
        if other is None:
            reasons.append(f"rank {r} ended its events without issuing it")
        else:
            reasons.append(f"rank {r} is blocked first in {where(other, everyone)}")
    never = all(ranks[r].blocked is None for r in missing)
    return (f"{where(c, everyone)}, issued by ranks {c.ranks} but {'never' if never else 'not yet'} by ranks "
            f"{missing} ({'; '.join(reasons)})")
