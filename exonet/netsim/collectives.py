"""Collective algorithms as phases of point-to-point messages.

A collective among n members ``g[0] < g[1] < ... < g[n-1]`` (positions 0..n-1) is a
list of *phases*; a phase is a set of messages ``(src, dst, bytes)`` that start
together. Phases are not pipelined: phase k+1 starts when every message of phase k
has been delivered. Chunks are real-valued (S/n need not divide). A group of one
member has no phases and takes no time.

Sizes: S is the buffer (all_reduce, broadcast) or the full input (reduce_scatter,
all_to_all); s is each rank's contribution (all_gather). The formulas below are the
times on an uncontended network where every NIC has rate B each way and every pair
latency α. With equal messages in a phase, max-min sharing makes a phase cost
α + m·c/B, where c is the message size and m the most messages any NIC sends or
receives in that phase (its flows all get B/m, and no flow anywhere gets less).

all_reduce
  ring              2(n−1) phases, g[i] → g[i+1 mod n], S/n each:  2(n−1)α + 2(n−1)/n·S/B
  halving_doubling  recursive-halving reduce-scatter then recursive-doubling
                    all-gather (Rabenseifner). n = 2^k:  2·log2(n)·α + 2(n−1)/n·S/B.
                    Otherwise, with p = 2^⌊log2 n⌋ and r = n − p: positions 2i+1 < 2r
                    first send S to 2i (which reduce), the p survivors run the
                    power-of-two algorithm, and 2i sends S back to 2i+1:
                    2(α + S/B) + 2·log2(p)·α + 2(p−1)/p·S/B
  tree              double binary tree (NCCL-style): tree A is the heap over
                    positions (parent of i is (i−1)//2), tree B its mirror
                    (i ↔ n−1−i), so a node is interior in at most one tree; each
                    tree carries S/2. Not pipelined: D = ⌊log2 n⌋ reduce levels
                    (deepest first, every node at depth d sends S/2 to its parent in
                    each tree) then D broadcast levels: Σ over the 2D levels of
                    (α + m·S/(2B)), m ≤ 2, so at most 2D(α + S/B); n = 2: 2α + S/B,
                    n = 4: 4α + 3S/B
  star              hub = g[0]; everyone sends S to the hub (incast on its
                    downlink), the hub reduces after all arrivals, sends S back:
                    2α + 2(n−1)·S/B
  direct            direct reduce-scatter (everyone sends S/n to everyone) then
                    direct all-gather:  2α + 2(n−1)/n·S/B

all_gather (s per rank)
  ring              n−1 phases of s:  (n−1)α + (n−1)·s/B
  halving_doubling  recursive doubling: at distance 2^j a rank sends all it holds.
                    n = 2^k:  log2(n)·α + (n−1)·s/B. Otherwise fold as above
                    (2i+1 sends s to 2i, which then holds 2s), double among the p
                    survivors, unfold (2i sends the (n−1)·s that 2i+1 lacks):
                    (α + s/B) + Σ_j (α + w_j/B) + (α + (n−1)·s/B), w_j the largest
                    block sent at distance 2^j
  star              everyone sends s to the hub, the hub sends each the (n−1)·s it
                    lacks:  2α + (n−1)·s/B + (n−1)²·s/B
  direct            everyone sends s to everyone:  α + (n−1)·s/B

reduce_scatter (S full input, S/n result per rank)
  ring              n−1 phases of S/n:  (n−1)α + (n−1)/n·S/B
  halving_doubling  recursive halving: at distance p/2^(j+1) a rank sends the part
                    its partner's half owns. n = 2^k:  log2(n)·α + (n−1)/n·S/B.
                    Otherwise fold (2i+1 sends S to 2i, which owns both chunks),
                    halve among the p survivors, then 2i sends S/n to 2i+1:
                    (α + S/B) + Σ_j (α + w_j/B) + (α + S/(nB))
  star              everyone sends S to the hub, which sends each its S/n:
                    2α + (n−1)·S/B + (n−1)/n·S/B
  direct            everyone sends S/n to everyone:  α + (n−1)/n·S/B

broadcast (S; the trace does not record the source: it is taken to be g[0])
  chain             pipelined chain g[0] → g[1] → ... in c chunks of S/c; phase q moves
                    chunk q−h over hop h:  (c + n − 2)·(α + S/(c·B)). Chunking rule:
                    c = 1 for n ≤ 2 or S = 0, else c = round(√((n−2)·S/(α·B))) clamped
                    to [1, 64] (the optimum of that formula), with α the largest hop
                    latency and B the slowest hop rate; c = 64 when α = 0
  binomial          at phase j every holder i < 2^j sends S to i + 2^j:
                    ⌈log2 n⌉·(α + S/B)
  binomial_fanout   gloo's broadcast: the same binomial tree, but a node sends to all
                    its children at once (its sends are posted without waiting), so
                    they share its uplink. Position v (bit length h) receives from
                    v − 2^(h−1) and sends S to every v + 2^i < n with i ≥ h; phase d
                    holds the sends of the positions with d bits set. Phase d costs
                    α + m_d·S/B, m_d the largest fan-out among them; n = 2^k:
                    k·α + k(k+1)/2·S/B (n = 4: 2α + 3S/B, n = 8: 3α + 6S/B)
  star              the source sends S to everyone:  α + (n−1)·S/B
  direct            scatter then direct all-gather (Van de Geijn): the source sends
                    S/n to each rank, then every rank sends its chunk to every rank
                    that lacks it:  2α + 2(n−1)/n·S/B

all_to_all (S full input; each rank sends S/n to each other member)
  direct            α + (n−1)/n·S/B
  star              everyone sends the hub the (n−1)·S/n meant for others, the hub
                    forwards to each the (n−1)·S/n meant for it:  2α + 2(n−1)²/n·S/B

reduce (S, to g[0]): each algorithm is its broadcast mirrored (phases backwards, every
message reversed), so it takes the broadcast's time:
  chain             (c + n − 2)·(α + S/(c·B)), c as for the broadcast chain
  binomial          ⌈log2 n⌉·(α + S/B)
  star              everyone sends S to the hub at once:  α + (n−1)·S/B
  direct            direct reduce-scatter, then every rank sends its S/n to the hub:
                    2α + 2(n−1)/n·S/B
  hierarchical      binomial trees level by level, innermost first, towards g[0]

gather (s per rank, to g[0]) and scatter (S full input, S/n to each, from g[0])
  direct            every rank sends s to the hub at once (NCCL's and gloo's grouped sends):
                    α + (n−1)·s/B; scatter: the hub sends each its S/n:  α + (n−1)/n·S/B
  binomial          round j: the holders at odd multiples of 2^j send their blocks of up to
                    2^j ranks 2^j down. n = 2^k:  k·α + (n−1)·s/B; scatter mirrors it
                    (s = S/n)

barrier (no payload)
  dissemination     ⌈log2 n⌉ rounds; in round d every member sends an empty message 2^d
                    ahead (gloo's barrier):  ⌈log2 n⌉·α
  star              everyone to the hub, the hub to everyone:  2α
  direct            everyone to everyone:  α

Rings follow regions: the ring algorithms (and chain) order the members region by region
(regions in the order their lowest member comes, ranks ascending within), so a ring
crosses each inter-region link once each way; with contiguous regions that is rank order.

hierarchical (the default under [hosts]; NCCL's two-level algorithm, one more level for regions)
  The members are laid on a grid of levels, innermost first: d_1 = L devices of the group
  per host (fabric: B_f, α_f), d_2 = hosts per region (NICs: B, α), d_3 = regions (the
  inter-region links), Π d = n; a level of size 1 is dropped. The rings of one level run
  at once (one per position in the other levels: level 2 has one ring per local rank,
  over that device's NIC) and share links max-min. A group whose hosts hold unequal
  numbers of its members, or whose regions unequal numbers of hosts, has no grid: it is
  one level, a flat ring in region order (so with no hosts and one region this is ring).
  reduce_scatter    ring reduce-scatter at each level, inside out, on what the level
                    before left:  Σ_i (d_i−1)·(α_i + S/(d_1⋯d_i)/B_i)
  all_gather        ring all-gather at each level, outside in (each rank's own s goes
                    across first, so no byte crosses a NIC twice), on blocks that grow:
                    Σ_i (d_i−1)·(α_i + s·d_{i+1}⋯d_k/B_i)
  all_reduce        reduce_scatter then all_gather of S/n: the outermost level is a ring
                    all-reduce of S/(d_1⋯d_{k−1}). Hosts (L = G, H hosts, NIC per device):
                    2[(G−1)α_f + (G−1)/G·S/B_f] + 2(H−1)α + 2(H−1)/H·(S/G)/B; with a
                    per-host NIC the G rings share one NIC, so the last term has S, not S/G.
                    Regions (m ranks each, no hosts, link B_l ≤ m·B):
                    2(m−1)(α + S/(mB)) + 2α_l + S/B_l: the link carries S each way, not
                    2(n−1)/n·S as a flat ring does. Hosts and regions: the three terms in turn.
  broadcast         binomial trees level by level, outermost first, from g[0]:
                    Σ_i ⌈log2 d_i⌉·(α_i + S/B_i)
  all_to_all        direct (every pair exchanges its own bytes; a hierarchy saves none)

  With per-host NICs, B above is the host NIC's rate and every ring of a level that leaves
  the host shares it; B_i is the rate a level's messages get when no other level runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from exonet.errors import ScenarioError
from exonet.netsim import gloo, nccl
from exonet.netsim.rings import mirrored, ordered, ring_phases
from exonet.netsim.topology import Phase, Topology
from exonet.scenario import FAMILIES

CHAIN_MAX_CHUNKS = 64

Members = Sequence[int]


def _levels(g: Members, topo: Topology) -> list[list[list[int]]]:
    """The hierarchy of ``g``, innermost level first: each level a list of rings that run at once.

    Members are laid on a grid (local index j within a host, host index i within a region,
    region index k), hosts and regions in the order their lowest member comes. Level 0 rings
    vary j (one per host), level 1 vary i (one per local rank and region), level 2 vary k
    (one per local rank and host index). Levels of size 1 are dropped. When the hosts do not
    all hold the same number of members, or the regions the same number of hosts, the grid
    does not exist and ``g`` is one level: a flat ring in region order.
    """
    regions: dict[str, dict[int, list[int]]] = {}
    for r in g:
        regions.setdefault(topo.region(r), {}).setdefault(topo.host(r), []).append(r)
    grid = [list(hosts.values()) for hosts in regions.values()]  # grid[k][i][j]
    H, L = len(grid[0]), len(grid[0][0])
    if any(len(hosts) != H or any(len(h) != L for h in hosts) for hosts in grid):
        return [[ordered(g, topo)]]
    R = len(grid)
    levels = [
        [[grid[k][i][j] for j in range(L)] for k in range(R) for i in range(H)],
        [[grid[k][i][j] for i in range(H)] for k in range(R) for j in range(L)],
        [[grid[k][i][j] for k in range(R)] for i in range(H) for j in range(L)],
    ]
    return [rings for rings in levels if len(rings[0]) > 1]


def _level_ring(rings: list[list[int]], size: float, count: int) -> list[Phase]:
    """``count`` ring phases of ``size`` on every ring of a level at once."""
    phase = tuple(m for ring in rings for m in ring_phases(ring, size, 1)[0])
    return [phase] * count


def _reduce_scatter_hier(g: Members, S: float, topo: Topology) -> list[Phase]:
    out, X = [], S
    for rings in _levels(g, topo):
        d = len(rings[0])
        out += _level_ring(rings, X / d, d - 1)
        X /= d
    return out


def _all_gather_hier(g: Members, s: float, topo: Topology) -> list[Phase]:
    out, block = [], s
    for rings in reversed(_levels(g, topo)):
        d = len(rings[0])
        out += _level_ring(rings, block, d - 1)
        block *= d
    return out


def _broadcast_hier(g: Members, S: float, topo: Topology) -> list[Phase]:
    """Binomial trees level by level, outermost first, from g[0]; at each level only the rings that hold the data
    (at their position 0) take part."""
    out: list[Phase] = []
    holders = {g[0]}
    for rings in reversed(_levels(g, topo)):
        active = [ring for ring in rings if ring[0] in holders]
        trees = [_broadcast_binomial(ring, S) for ring in active]
        out += [tuple(m for tree in trees for m in tree[j]) for j in range(len(trees[0]))]
        holders.update(r for ring in active for r in ring)
    return out


def _pairs(g: Members, size: float) -> Phase:
    """Every member sends ``size`` to every other member."""
    return tuple((a, b, size) for a in g for b in g if a != b)


def _to_hub(g: Members, size: float) -> Phase:
    return tuple((r, g[0], size) for r in g[1:])


def _from_hub(g: Members, size: float) -> Phase:
    return tuple((g[0], r, size) for r in g[1:])


def _fold(g: Members) -> tuple[int, int, list[int]]:
    """Halving/doubling on any n: p = 2^⌊log2 n⌋ survivors; ``real[v]`` is survivor v's rank.

    Positions 2i and 2i+1 for i < r = n − p are folded into survivor i (at 2i).
    """
    n = len(g)
    p = 1 << (n.bit_length() - 1)
    r = n - p
    real = [g[2 * v] if v < r else g[v + r] for v in range(p)]
    return p, r, real


def _block(weights: list[float], v: int, size: int) -> float:
    """Total weight of the aligned block of ``size`` survivors that contains survivor ``v``."""
    start = v - v % size
    return sum(weights[start : start + size])


def _fold_in(g: Members, r: int, size: float) -> list[Phase]:
    return [tuple((g[2 * i + 1], g[2 * i], size) for i in range(r))] if r else []


def _fold_out(g: Members, r: int, size: float) -> list[Phase]:
    return [tuple((g[2 * i], g[2 * i + 1], size) for i in range(r))] if r else []


def _all_reduce_hd(g: Members, S: float) -> list[Phase]:
    p, r, real = _fold(g)
    halving = [
        tuple((real[v], real[v ^ (p >> (j + 1))], S / (2 << j)) for v in range(p))
        for j in range(p.bit_length() - 1)
    ]
    return [*_fold_in(g, r, S), *halving, *reversed(halving), *_fold_out(g, r, S)]


def _all_gather_hd(g: Members, s: float) -> list[Phase]:
    n = len(g)
    p, r, real = _fold(g)
    held = [2 * s if v < r else s for v in range(p)]
    doubling = []
    for j in range(p.bit_length() - 1):
        block = 1 << j
        doubling.append(tuple((real[v], real[v ^ block], _block(held, v, block)) for v in range(p)))
    return [*_fold_in(g, r, s), *doubling, *_fold_out(g, r, (n - 1) * s)]


def _reduce_scatter_hd(g: Members, S: float) -> list[Phase]:
    n = len(g)
    p, r, real = _fold(g)
    owns = [(2 if v < r else 1) * S / n for v in range(p)]
    halving = []
    for j in range(p.bit_length() - 1):
        d = p >> (j + 1)
        halving.append(tuple((real[v], real[v ^ d], _block(owns, v ^ d, d)) for v in range(p)))
    return [*_fold_in(g, r, S), *halving, *_fold_out(g, r, S / n)]


def _all_reduce_tree(g: Members, S: float) -> list[Phase]:
    n = len(g)

    def depth(i: int) -> int:
        """Depth of position i in tree A (the heap); i's depth in tree B is depth(n−1−i)."""
        return (i + 1).bit_length() - 1

    def level(d: int) -> tuple[tuple[int, int, float], ...]:
        """Every position at depth d sends S/2 to its parent, in tree A and in tree B."""
        msgs = []
        for i in range(n):
            if i and depth(i) == d:
                msgs.append((g[i], g[(i - 1) // 2], S / 2))
            m = n - 1 - i
            if m and depth(m) == d:
                msgs.append((g[i], g[n - 1 - (m - 1) // 2], S / 2))
        return tuple(msgs)

    up = [level(d) for d in range(depth(n - 1), 0, -1)]
    down = [tuple((dst, src, size) for src, dst, size in phase) for phase in reversed(up)]
    return [*up, *down]


def _chain_chunks(g: Members, S: float, topo: Topology) -> int:
    n = len(g)
    if n <= 2 or S == 0:
        return 1
    hops = [topo.path(g[h], g[h + 1]) for h in range(n - 1)]
    alpha = max(p.latency for p in hops)
    if alpha == 0:
        return CHAIN_MAX_CHUNKS
    rate = min(p.rate for p in hops)
    return max(1, min(CHAIN_MAX_CHUNKS, round(math.sqrt((n - 2) * S / (alpha * rate)))))


def _broadcast_chain(g: Members, S: float, topo: Topology) -> list[Phase]:
    n = len(g)
    c = _chain_chunks(g, S, topo)
    return [
        tuple((g[h], g[h + 1], S / c) for h in range(n - 1) if 0 <= q - h < c)
        for q in range(c + n - 2)
    ]


def _broadcast_binomial(g: Members, S: float) -> list[Phase]:
    n = len(g)
    return [
        tuple((g[i], g[i + (1 << j)], S) for i in range(min(1 << j, n - (1 << j))))
        for j in range((n - 1).bit_length())
    ]


def _broadcast_fanout(g: Members, S: float) -> list[Phase]:
    n = len(g)
    phases: list[list[tuple[int, int, float]]] = [[] for _ in range((n - 1).bit_length())]
    for v in range(n):
        for i in range(v.bit_length(), (n - 1).bit_length()):
            if v + (1 << i) < n:
                phases[v.bit_count()].append((g[v], g[v + (1 << i)], S))
    return [tuple(p) for p in phases if p]


def _broadcast_direct(g: Members, S: float) -> list[Phase]:
    n = len(g)
    rest = tuple((a, b, S / n) for a in g for b in g[1:] if a != b)
    return [_from_hub(g, S / n), rest]


def _gather_binomial(g: Members, s: float) -> list[Phase]:
    """Round j: each holder at an odd multiple of 2^j sends what it holds (its block of up to 2^j ranks) 2^j down."""
    n = len(g)
    return [
        tuple((g[i], g[i - (1 << j)], min(1 << j, n - i) * s) for i in range(1 << j, n, 2 << j))
        for j in range((n - 1).bit_length())
    ]


def _barrier_dissemination(g: Members) -> list[Phase]:
    """Round d: every member sends an empty message 2^d ahead (gloo's barrier: Hensgen, Finkel and Manber 1988)."""
    n = len(g)
    return [tuple((g[i], g[(i + (1 << d)) % n], 0.0) for i in range(n)) for d in range((n - 1).bit_length())]


Builder = Callable[[Members, float, Topology], list[Phase]]

BUILDERS: dict[str, dict[str, Builder]] = {
    "all_reduce": {
        "ring": lambda g, S, t: ring_phases(ordered(g, t), S / len(g), 2 * (len(g) - 1)),
        "halving_doubling": lambda g, S, t: _all_reduce_hd(g, S),
        "tree": lambda g, S, t: _all_reduce_tree(g, S),
        "star": lambda g, S, t: [_to_hub(g, S), _from_hub(g, S)],
        "direct": lambda g, S, t: [_pairs(g, S / len(g))] * 2,
        "hierarchical": lambda g, S, t: [*_reduce_scatter_hier(g, S, t), *_all_gather_hier(g, S / len(g), t)],
        "nccl": lambda g, S, t: nccl.plan("all_reduce", g, S, t),
        "gloo": lambda g, S, t: gloo.plan("all_reduce", g, S, t),
    },
    "all_gather": {
        "ring": lambda g, s, t: ring_phases(ordered(g, t), s, len(g) - 1),
        "halving_doubling": lambda g, s, t: _all_gather_hd(g, s),
        "star": lambda g, s, t: [_to_hub(g, s), _from_hub(g, (len(g) - 1) * s)],
        "direct": lambda g, s, t: [_pairs(g, s)],
        "hierarchical": _all_gather_hier,
        "nccl": lambda g, s, t: nccl.plan("all_gather", g, s, t),
        "gloo": lambda g, s, t: gloo.plan("all_gather", g, s, t),
    },
    "reduce_scatter": {
        "ring": lambda g, S, t: ring_phases(ordered(g, t), S / len(g), len(g) - 1),
        "halving_doubling": lambda g, S, t: _reduce_scatter_hd(g, S),
        "star": lambda g, S, t: [_to_hub(g, S), _from_hub(g, S / len(g))],
        "direct": lambda g, S, t: [_pairs(g, S / len(g))],
        "hierarchical": _reduce_scatter_hier,
        "nccl": lambda g, S, t: nccl.plan("reduce_scatter", g, S, t),
    },
    "broadcast": {
        "chain": lambda g, S, t: _broadcast_chain(ordered(g, t), S, t),
        "binomial": lambda g, S, t: _broadcast_binomial(g, S),
        "binomial_fanout": lambda g, S, t: _broadcast_fanout(g, S),
        "star": lambda g, S, t: [_from_hub(g, S)],
        "direct": lambda g, S, t: _broadcast_direct(g, S),
        "hierarchical": _broadcast_hier,
        "nccl": lambda g, S, t: nccl.plan("broadcast", g, S, t),
    },
    "all_to_all": {
        "direct": lambda g, S, t: [_pairs(g, S / len(g))],
        "star": lambda g, S, t: [_to_hub(g, (len(g) - 1) * S / len(g)), _from_hub(g, (len(g) - 1) * S / len(g))],
    },
    "reduce": {  # each the mirror of its broadcast, towards g[0]; gloo's and NCCL's from their sources
        "chain": lambda g, S, t: mirrored(_broadcast_chain(ordered(g, t), S, t)),
        "binomial": lambda g, S, t: mirrored(_broadcast_binomial(g, S)),
        "star": lambda g, S, t: [_to_hub(g, S)],
        "direct": lambda g, S, t: mirrored(_broadcast_direct(g, S)),
        "hierarchical": lambda g, S, t: mirrored(_broadcast_hier(g, S, t)),
        "nccl": lambda g, S, t: nccl.plan("reduce", g, S, t),
        "gloo": lambda g, S, t: gloo.plan("reduce", g, S, t),
    },
    "gather": {
        "direct": lambda g, s, t: [_to_hub(g, s)],
        "binomial": lambda g, s, t: _gather_binomial(g, s),
    },
    "scatter": {
        "direct": lambda g, S, t: [_from_hub(g, S / len(g))],
        "binomial": lambda g, S, t: mirrored(_gather_binomial(g, S / len(g))),
    },
    "barrier": {
        "dissemination": lambda g, S, t: _barrier_dissemination(g),
        "star": lambda g, S, t: [_to_hub(g, 0.0), _from_hub(g, 0.0)],
        "direct": lambda g, S, t: [_pairs(g, 0.0)],
        "nccl": lambda g, S, t: nccl.plan("all_reduce", g, 4.0, t),  # torch's NCCL barrier: a one-float all-reduce
    },
}


def algorithm_names(algorithms: dict[str, str]) -> dict[str, str]:
    """Each op's algorithm name for a scenario's ``algorithms``; ops it leaves out take the ring family."""
    return {op: algorithms.get(op, FAMILIES["ring"][op]) for op in BUILDERS}


def choose(algorithms: dict[str, str]) -> dict[str, Builder]:
    """Each op's builder for a scenario's ``algorithms``; ops it leaves out take the ring family."""
    out = {}
    for op, name in algorithm_names(algorithms).items():
        table = BUILDERS[op]
        if name not in table:
            raise ScenarioError(f"scenario: algorithm {name!r} is not offered for {op}; "
                                f"choose one of {', '.join(table)}")
        out[op] = table[name]
    return out


def phases(builder: Builder, members: Members, nbytes: float, topo: Topology) -> list[Phase]:
    """The phases of one collective; none for a group of one."""
    return builder(members, float(nbytes), topo) if len(members) > 1 else []
