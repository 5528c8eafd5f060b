"""A replay that works out each distinct step once: a step that repeats one already replayed is played back.

Training repeats itself: an estimate's steps are identical, and so are a hand-written trace's. Once its
connections are warm, step k+1 of such a replay starts from the state step k started from, only later,
and does exactly what step k did. Replaying it again is wasted work; this module plays it back instead.
Exact, not approximate: the result is the full replay's, tick for tick and bit for bit.

* The trace is fed one step at a time. After a step, the replay is *quiescent* when nothing is in flight
  (no collective open, queued, running, resting or on the network, nothing on the agenda) and every rank
  has done its step and waits for input. Its *key* is then everything that decides what comes next,
  relative to the earliest rank's cursor: each rank's cursor, sync and span marks (not where it last
  blocked, which is read only while it is blocked), each group's last end
  (which decides how cold its connections are), which groups have paid their set-up, whether a phase lost
  packets (both only grow, so a step that changes them is never played back).
* A step that starts from a key seen before (the replay is in a cycle: every step of an estimate, every
  outer round of DiLoCo) is recorded as a tape: every span each rank spent, every collective that started
  (its wire bytes) and ended, every addition to the links' busy times, how every counter moved, and the
  key it ended at. Its *signature* is each rank's events in the step, with compute in ticks and async ids
  numbered within the step.
* At a later boundary with that key, a step with that signature would replay exactly as the recorded one,
  shifted in time (the replay depends on tick differences only). The tape is played back instead,
  shifted, in its order, so even float sums are added as the full replay adds them; the replay is then at
  the tape's end key, where the next step may be played back too.

Where compute varies per step (jitter, measured times), steps are not expected to repeat: when the first
rank's compute differs in every one of its first 64 steps the trace is fed whole at once (``Memo._varies``),
and where keys or steps still fail to repeat the memo gives up and feeds the rest whole (``Memo._futile``).
``SimResult.stats["memo"]`` says how many steps were played back. Only a replay without outages, failures,
per-step gates and timed compute windows is fed in steps, and a step with point-to-point messages is always replayed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from exonet.netsim.agenda import SCALE, TICK
from exonet.netsim.fastpath import Plan
from exonet.netsim.spans import COMM, COMPUTE, IDLE
from exonet.netsim.state import Instance, RankState
from exonet.trace import P2P_OPS, Collective, Compute, Step, Trace, Wait

if TYPE_CHECKING:
    from exonet.netsim.compute import ComputeModel
    from exonet.netsim.engine import Simulation

Key = tuple[int, tuple]  # (the earliest cursor, the state relative to it)


@dataclass
class Spans:
    """What one rank's ``_spend`` calls in a step made, in ticks relative to the step's boundary."""

    extend_to: int | None  # the end its last span before the step was extended to (None: not extended)
    ticks: list[int]  # the (start, end) of each new span, flat
    kinds: bytes  # the kind of each new span
    spent: tuple[int, int, int]  # ticks added to compute, comm and idle
_LIMIT = 1 << 16  # keys remembered, tapes kept: a cycle longer than this is replayed whole
_MISSES = 16  # misses (see Memo._futile) before the memo may give up
_SIGNATURES = 2  # steps recorded from one key (more, and its steps vary: the sync point of jittered compute)
_CHUNK = 64  # links whose busy seconds a played-back step adds at once (64 × a step's additions: a few MB)
_PROBE = 64  # steps whose compute is looked at first: all different, and no step is expected to repeat
_UNSEEN = 1024  # boundaries without a key met twice before it gives up: a cycle of up to 500 steps is found


@dataclass
class Tape:
    """One recorded step: what it did, relative to its boundary's earliest cursor, and the key it ended at."""

    key: tuple
    end_key: tuple  # the key it ended at, relative to its own end
    signature: tuple
    step: int  # the step recorded
    base: int  # the earliest cursor when it began (ticks): the times below are relative to it
    shift: int  # how far the step moved the earliest cursor (ticks)
    spans: list[Spans]  # per rank: what its ``_spend`` calls made of its timeline and its totals
    started: list[Plan]  # the plans collectives started on, in order (their wire bytes)
    busy: list[np.ndarray]  # additions to the fast path's busy seconds, in order
    net_busy: list[tuple[np.ndarray, np.ndarray]]  # the fluid network's busy seconds added, by links alike (_by_links)
    ended: list[Instance]  # the collectives that ended, in order
    queue_steps: dict[tuple[int, ...], int]  # collectives each queue (group) took
    async_ended: list[list[int]]  # per rank: the index into ``ended`` of each async collective it issued, in order
    counters: list[tuple[int, int, int, dict]]  # per rank: lost, aborted, kept steps and its counts' growth
    events: int  # events replayed
    alone: dict[Plan, int]  # collectives that ran whole on the fast path, per plan
    tokens: int  # the fluid network's rate changes
    after: dict[str, Any] = field(default_factory=dict)  # the state at the step's end, relative to its start


class Memo:
    """Feeds a ``Simulation`` one step at a time and plays back the steps that repeat a recorded one."""

    def __init__(self, sim: Simulation, trace: Trace) -> None:
        self.sim = sim
        self.trace = trace
        self.ranks = sim.replayed_ranks(trace)
        self.bounds: list[list[int]] = []  # per rank replayed: the index after each of its steps (set by ``fits``)
        self.steps = 0  # steps fed one at a time (0: the trace is fed whole)
        self.played = 0  # steps played back
        self.checked = 0  # quiescent boundaries whose key was looked at
        self.missed = 0  # boundaries with tapes for their key, none for their step's events
        self.recorded = 0  # steps recorded
        self.seen: set[int] = set()  # the hashes of the keys met (a step from one met again is recorded)
        self.tapes: dict[tuple, dict[tuple, Tape]] = {}  # key -> signature -> the step recorded from there

    @property
    def events(self) -> int:
        """The events the replay runs or plays back."""
        return sum(len(self.trace.events[rk.rank]) for rk in self.ranks)

    @staticmethod
    def applies(sim: Simulation) -> bool:
        """Whether ``sim`` may be fed in steps: nothing but the network stops anything, and nothing was fed yet."""
        cm = sim._cm
        return (sim._calm and sim._rewind and not sim._gates and not any(cm.windowed) and cm.failures is None
                and not any(rk.queue for rk in sim._ranks))

    def fits(self) -> bool:
        """Whether a step may repeat another and every rank replayed has the same number of steps (else the trace is
        fed whole); it finds the steps' bounds."""
        if self._varies():
            return False
        self.bounds = [[i + 1 for i, e in enumerate(self.trace.events[rk.rank]) if type(e) is Step]
                       for rk in self.ranks]
        return len({len(b) for b in self.bounds}) == 1 and len(self.bounds[0]) > 2

    def _varies(self) -> bool:
        """Whether the first rank computes for other times in each of its first ``_PROBE`` steps (a trace timed by its
        measured CPU seconds), so that no step is expected to repeat another and feeding in steps would only cost.
        The result is the same either way; a trace whose steps repeat only later (a cycle longer than the probe)
        is then replayed whole, which is slower, not different.

        It reads no further than those steps, and ``work`` draws a rank's jitter by step, whoever asks first, so
        looking ahead changes nothing."""
        cm, rank = self.sim._cm, self.ranks[0].rank
        works: set[tuple[int, ...]] = set()
        step, spans = 0, []
        for e in self.trace.events[rank]:
            if type(e) is Compute:
                spans.append(_work_ticks(cm, rank, step, e))
            elif type(e) is Step:
                works.add(tuple(spans))
                step, spans = step + 1, []
                if step >= _PROBE:
                    break
        return step > 1 and len(works) == step

    def run(self) -> None:
        """Feed the whole trace, step by step, playing back what repeats; the caller then takes ``sim.result``."""
        sim = self.sim
        if not self.fits():
            for rk in self.ranks:
                rk.queue.extend(self.trace.events[rk.rank])
            return
        self.steps = len(self.bounds[0])
        step = 0
        while step < self.steps and not self._futile():
            here = self._key()
            if here is not None:
                self.checked += 1
                here, step = self._play_back(here, step)
                if step == self.steps:
                    break
            if here is not None and hash(here[1]) in self.seen and len(self.tapes.get(here[1], ())) < _SIGNATURES:
                self._record(step, here)
            else:
                self._feed(step)
                sim.run_until_blocked()
            if here is not None:
                if len(self.seen) >= _LIMIT:
                    self.seen.clear()
                self.seen.add(hash(here[1]))
            step += 1
        for i, rk in enumerate(self.ranks):  # the rest (what follows the last step; all of it, if futile), whole
            bounds = self.bounds[i]
            rk.queue.extend(self.trace.events[rk.rank][bounds[step - 1] if step else 0:])
            sim._lookahead.discard(rk.rank)

    def _futile(self) -> bool:
        """Whether to feed the rest whole: steps keep meeting keys recorded before with events none of their tapes
        has (compute that varies after a sync point that levels the ranks), or no key came back in ``_UNSEEN``
        boundaries (compute that varies, and no sync point levels it). Checking then costs more than it saves."""
        return ((self.missed >= _MISSES and self.missed > 4 * self.played)
                or (self.checked >= _UNSEEN and not self.recorded))

    def _play_back(self, here: Key, step: int) -> tuple[Key | None, int]:
        """Play back every step from ``step`` on that a tape covers; the key and the step reached."""
        agenda = self.sim._agenda
        while step < self.steps:
            tapes = self.tapes.get(here[1])
            if not tapes:
                break
            tape: Tape | None = None
            for signature, candidate in tapes.items():
                matched, ids = self._signature(step, signature)
                if matched is not None:
                    tape = candidate
                    break
            if tape is None:
                self.missed += 1
                break
            self._play(tape, step, here[0], ids)
            here = (here[0] + tape.shift, tape.end_key)
            step += 1
            self.played += 1
            if agenda.every:
                agenda.on_slots()  # a progress bar looks at the clock
        return here, step

    def stats(self) -> dict[str, Any]:
        return {"steps": self.steps, "played_back": self.played, "hit_rate": self.played / max(1, self.steps),
                "boundaries": self.checked, "missed": self.missed}

    # ------------------------------------------------------------ feeding
    def _events(self, rank: int, step: int) -> list:
        bounds = self.bounds[rank]
        return self.trace.events[self.ranks[rank].rank][bounds[step - 1] if step else 0:bounds[step]]

    def _feed(self, step: int) -> None:
        for i, rk in enumerate(self.ranks):
            rk.queue.extend(self._events(i, step))
            self.sim._lookahead.discard(rk.rank)

    def _signature(self, step: int, against: tuple | None = None) -> tuple[tuple | None, list[list[int]]]:
        """Each rank's events in ``step`` (compute in ticks, async ids by their order in the step; None: a step
        this module does not play back), and each rank's async ids in the step, in order. Given a signature
        ``against``, it stops at the first difference (None): a jittered step differs at its first compute."""
        cm = self.sim._cm
        out: list[Any] = []
        ids: list[list[int]] = []
        for i, rk in enumerate(self.ranks):
            local: dict[int, int] = {}
            for e in self._events(i, step):
                kind = type(e)
                item: Any
                if kind is Compute:
                    item = _work_ticks(cm, rk.rank, step, e)
                elif kind is Collective:
                    if e.op in P2P_OPS:
                        return None, ids
                    if e.async_op:
                        local[e.cid] = len(local)
                    item = (e.op, e.nbytes, e.group, e.async_op)
                elif kind is Wait:
                    if e.cid not in local:
                        return None, ids  # it waits for an earlier step's collective
                    item = ("wait", local[e.cid])
                elif kind is Step:
                    item = "step"
                else:
                    return None, ids
                if against is not None and (len(out) >= len(against) or against[len(out)] != item):
                    return None, ids
                out.append(item)
            ids.append(list(local))
        if against is not None and len(out) != len(against):
            return None, ids
        return tuple(out), ids

    # --------------------------------------------------------------- keys
    def _key(self) -> Key | None:
        """The earliest cursor and the state relative to it, if the replay is quiescent (else None)."""
        sim = self.sim
        hand = sim._handover
        if (sim._agenda.pending or sim._open or sim._active or sim._net.batches or hand.lone is not None
                or hand.resting or any(sim._running.values()) or any(sim._queued.values())):
            return None
        ranks = self.ranks
        for rk in ranks:
            if rk.blocked is not None or rk.queue or rk.kept is not None or rk.gate or rk.unsynced:
                return None
        base = min(rk.t for rk in ranks)
        per_rank = tuple((rk.t - base, rk.synced - base, rk.span_end - base,
                          rk.kinds[-1] if rk.kinds else -1, rk.since_work, rk.compute - rk.mark, rk.trained[1],
                          rk.compute - rk.trained[2]) for rk in ranks)
        # (in the order groups first ended: the same history gives the same order; another order only misses)
        groups = tuple((members, t - base) for members, t in sim._group_end.items())
        taken = hand.taken_at - base if hand.taken_at >= base else None  # one before the boundary is never met again
        return base, (per_rank, groups, len(sim._set_up), sim._topo.lossy, sim._last_end - base, taken)

    # ---------------------------------------------------------- recording
    def _record(self, step: int, here: Key) -> None:
        """Replay ``step`` while recording it, and keep its tape if it ended quiescent."""
        self.recorded += 1
        sim, ranks = self.sim, self.ranks
        index = {rk.rank: i for i, rk in enumerate(ranks)}
        spent: list[tuple[int, int, int, int]] = []
        started: list[Plan] = []
        busy: list[np.ndarray] = []
        spend, carry, add_busy = sim._spend, sim._carry, sim._add_busy

        def recording_spend(rk: RankState, a: int, b: int, kind: int) -> None:
            spent.append((index[rk.rank], a, b, kind))
            spend(rk, a, b, kind)

        def recording_carry(plan: Plan) -> None:
            started.append(plan)
            carry(plan)

        def recording_busy(b: np.ndarray) -> None:
            busy.append(b)
            add_busy(b)

        before = [(rk.lost, rk.aborted, rk.trained[0], dict(rk.counts)) for rk in ranks]
        ends_at, ended_at, events = len(sim._step_ends), len(sim._ended), sim._events
        tokens, alone = sim._net_token, dict(sim._alone)
        sim._spend, sim._carry, sim._add_busy = recording_spend, recording_carry, recording_busy  # type: ignore
        sim._net.tape = []
        try:
            self._feed(step)
            sim.run_until_blocked()
        finally:
            del sim._spend, sim._carry, sim._add_busy
            net_busy, sim._net.tape = sim._net.tape, None
        after = self._key()
        signature, ids = self._signature(step)
        if after is None or signature is None:
            return
        base = here[0]
        ended = sim._ended[ended_at:]
        position = {id(c): k for k, c in enumerate(ended)}
        queue_steps: dict[tuple[int, ...], int] = {}
        for c in ended:
            queue_steps[c.key[0]] = queue_steps.get(c.key[0], 0) + 1
        by_rank: list[list[tuple[int, int, int]]] = [[] for _ in ranks]
        for i, a, b, kind in spent:
            by_rank[i].append((a - base, b - base, kind))
        if sum(map(len, self.tapes.values())) >= _LIMIT:
            self.tapes.clear()
        self.tapes.setdefault(here[1], {})[signature] = Tape(
            key=here[1], end_key=after[1], signature=signature, step=step, base=base, shift=after[0] - base,
            spans=[_spans(calls, start) for calls, start in zip(by_rank, here[1][0])], started=started, busy=busy,
            net_busy=_by_links(net_busy), ended=ended, queue_steps=queue_steps,
            async_ended=[[position[id(rk.async_ops[cid])] for cid in cids] for rk, cids in zip(ranks, ids)],
            counters=[(rk.lost - lost, rk.aborted - aborted, rk.trained[0] - kept,
                       {q: n - counts.get(q, 0) for q, n in rk.counts.items() if n != counts.get(q, 0)})
                      for rk, (lost, aborted, kept, counts) in zip(ranks, before)],
            events=sim._events - events, tokens=sim._net_token - tokens,
            alone={plan: n - alone.get(plan, 0) for plan, n in sim._alone.items() if n != alone.get(plan, 0)},
            after=self._relative(base, ends_at),
        )

    def _relative(self, base: int, ends_at: int) -> dict[str, Any]:
        """What a played-back step sets, relative to the boundary it began at (``base``)."""
        sim = self.sim
        return {
            "ranks": [(rk.t - base, rk.synced - base, rk.span_end - base, rk.since_work,
                       rk.compute - rk.mark, rk.trained[1], rk.compute - rk.trained[2],
                       [t - base for t in rk.step_ends[-1:]]) for rk in self.ranks],
            "step_ends": [t - base for t in sim._step_ends[ends_at:]],
            "last_end": sim._last_end - base,
            "group_end": {members: t - base for members, t in sim._group_end.items()},
            "taken_at": sim._handover.taken_at - base if sim._handover.taken_at >= 0 else None,
        }

    # ----------------------------------------------------------- playback
    def _play(self, tape: Tape, step: int, base: int, ids: list[list[int]]) -> None:
        """Play ``tape`` back as ``step`` (each rank's async ids ``ids``), beginning at ``base``: the full replay's
        additions, in its order."""
        sim, ranks = self.sim, self.ranks
        for rk, spans in zip(ranks, tape.spans):
            times = rk.times
            if spans.extend_to is not None:
                times[-1] = (spans.extend_to + base) * TICK
            times.extend([(t + base) * TICK for t in spans.ticks])
            rk.kinds.extend(spans.kinds)
            compute, comm, idle = spans.spent
            rk.compute += compute
            rk.comm += comm
            rk.idle += idle
        for plan in tape.started:
            sim._carry(plan)
        for vector in tape.busy:
            sim._add_busy(vector)
        busy_s = sim._net.busy_s
        for links, terms in tape.net_busy:
            sums = np.empty_like(terms)
            width = terms.shape[1]
            for k in range(0, len(links), width):  # a chunk's rows stay in cache
                chunk = links[k:k + width]
                terms[0, :len(chunk)] = busy_s[chunk]
                np.add.accumulate(terms[:, :len(chunk)], axis=0, out=sums[:, :len(chunk)])
                busy_s[chunk] = sums[-1, :len(chunk)]
        copies = [_shifted(c, base - tape.base, (step - tape.step) * tape.queue_steps[c.key[0]]) for c in tape.ended]
        sim._ended.extend(copies)
        for rk, cids, positions in zip(ranks, ids, tape.async_ended):
            for cid, k in zip(cids, positions):
                rk.async_ops[cid] = copies[k]
        for plan, n in tape.alone.items():
            sim._alone[plan] = sim._alone.get(plan, 0) + n
        sim._events += tape.events
        sim._net_token += tape.tokens
        self._settle(tape, base)

    def _settle(self, tape: Tape, base: int) -> None:
        """Set the state at the played-back step's end (relative to ``base``), and move its counters."""
        sim, after = self.sim, tape.after
        for rk, rel, (lost, aborted, kept, grown) in zip(self.ranks, after["ranks"], tape.counters):
            t, synced, span_end, since_work, unmarked, since_sync, since_step, ends = rel
            rk.t, rk.synced, rk.span_end = t + base, synced + base, span_end + base
            rk.since_work, rk.mark = since_work, rk.compute - unmarked
            rk.trained[0] += kept
            rk.trained[1], rk.trained[2] = since_sync, rk.compute - since_step
            rk.lost += lost
            rk.aborted += aborted
            rk.step += 1
            rk.step_ends.extend(e + base for e in ends)
            for queue, n in grown.items():
                rk.counts[queue] += n
        sim._step_ends.extend(e + base for e in after["step_ends"])
        sim._last_end = after["last_end"] + base
        for members, t in after["group_end"].items():
            sim._group_end[members] = t + base
        if after["taken_at"] is not None:
            sim._handover.taken_at = after["taken_at"] + base


def _work_ticks(cm: ComputeModel, rank: int, step: int, span: Compute) -> int:
    """The ticks of compute ``span`` at ``step`` on ``rank``, as a step's signature holds them."""
    return round(cm.work(rank, step, span) * SCALE)


def _spans(spent: list[tuple[int, int, int]], start: tuple) -> Spans:
    """What ``Simulation._spend`` makes of the calls ``spent`` (from, to, kind) on a rank whose key at the step's
    boundary is ``start`` (its last span's end and kind are there): spans of one kind that meet are one."""
    kind_now, end_now = start[3], start[2]
    extend_to, kinds, totals = None, bytearray(), [0, 0, 0]
    ticks: list[int] = []
    for a, b, kind in spent:
        if b <= a:
            continue
        totals[kind] += b - a
        if kind_now == kind and end_now == a:
            if ticks:
                ticks[-1] = b
            else:
                extend_to = b
        else:
            ticks += [a, b]
            kinds.append(kind)
            kind_now = kind
        end_now = b
    return Spans(extend_to, ticks, bytes(kinds), (totals[COMPUTE], totals[COMM], totals[IDLE]))


def _by_links(additions: list[tuple[np.ndarray, float]] | None) -> list[tuple[np.ndarray, np.ndarray]]:
    """The additions ``busy_s[moving] += dt`` (``moving`` a mask over the links), grouped by links alike:
    (links, terms), where those links each got the same additions, which ``terms`` holds in order in its rows
    1.., in as many identical columns as a chunk of links (``_CHUNK``) takes, below a row set on play.

    Two links got the same additions when every distinct mask holds both or neither, and a step has a few masks
    (one per set of phases in transit), so a ring's links fall in a few groups. Adding a group's rows down its
    columns (``np.add.accumulate``) adds each link's terms in the full replay's order: its sums are the replay's."""
    if not additions:
        return []
    index: dict[bytes, int] = {}
    masks: list[np.ndarray] = []
    which = np.empty(len(additions), dtype=np.intp)
    for i, (moving, _) in enumerate(additions):
        assert moving.dtype == bool  # FluidNetwork's masks over its links (an index array would group wrongly)
        which[i] = index.setdefault(moving.tobytes(), len(masks))
        if which[i] == len(masks):
            masks.append(moving)
    dts = np.array([dt for _, dt in additions])
    patterns, group_of = np.unique(np.array(masks).T, axis=0, return_inverse=True)
    out = []
    for g, pattern in enumerate(patterns):
        if pattern.any():
            members = np.flatnonzero(group_of.reshape(-1) == g)
            got = dts[pattern[which]]
            terms = np.empty((1 + len(got), min(_CHUNK, len(members))))
            terms[1:] = got[:, None]
            out.append((members, terms))
    return out


def _shifted(c: Instance, delta: int, later: int) -> Instance:
    """A copy of the recorded collective ``c``, ``delta`` ticks later and ``later`` places further in its queue."""
    copy = Instance.__new__(Instance)
    for name in Instance.__slots__:
        setattr(copy, name, getattr(c, name))
    copy.start, copy.end, copy.last = c.start + delta, c.end + delta, c.last + delta
    copy.waiters = []
    copy.key = (c.key[0], c.key[1] + later)
    return copy
