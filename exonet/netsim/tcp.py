"""TCP as Linux runs it: the window a socket gets, and slow start after idle.

A scenario with ``network.backend`` describes real hosts talking TCP, so two Linux defaults
apply unless the scenario says otherwise:

* **The window.** A socket's window is bounded by its buffers: ``net.ipv4.tcp_wmem`` max 4 MiB,
  of which a bulk sender keeps about 70% in flight, and ``net.ipv4.tcp_rmem`` max 6 MiB, half of
  which the receiver advertises. The smaller, 2.8 MiB (``exonet.scenario.resolved.LINUX_WINDOW``),
  is the window of one stream, so one stream at 74 ms RTT carries at most 2.8 MiB / 74 ms ≈ 317 Mbit/s.
* **Slow start after idle** (``net.ipv4.tcp_slow_start_after_idle = 1``, the default). A
  connection that sent nothing for longer than its retransmission timeout restarts its
  congestion window (``tcp_cwnd_restart`` in ``net/ipv4/tcp_output.c``): the window it had
  (``had_window``: twice what it kept in flight) halves for every RTO of idle beyond the first,
  down to the initial window of 10 segments (RFC 6928). A new connection
  starts there too. The RTO is the smoothed RTT plus a variance term that Linux keeps at least
  ``tcp_rto_min`` = 200 ms, so RTO = RTT + 200 ms on a steady path.

Slow start as a delay (``slow_start_delay``). From a window of w₀ bytes per stream, a stream
sends w₀·2^i bytes in round i and then waits for the round trip R to end before round i+1, as
long as w₀·2^i is below the bytes its fair rate r keeps in flight (r·R); after that it runs at r.
Compared with the fluid model (d bytes at rate r take d/r), a transfer of d bytes per stream is
late by Σ (R − w₀·2^i / r) over its rounds that end before its last byte is sent and are still
below r·R: the rounds that wait. The last round never waits (its bytes then take the path's
latency, as in the fluid model). A collective pays this on each pair's messages in turn, on the
bytes that pair has sent since the connection went cold (``cold_phases``): the ramp goes on
across phases, which follow each other without an idle RTO.

Which plans are cold is the engine's call: the first collective of a group (its connections are
new) and one that starts more than an RTO after the group's previous one ended. Each process
group has its own connections (NCCL communicators and gloo process groups both open their own
sockets), so idle time is counted per group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# Linux's initial congestion window (RFC 6928) of full segments, 1448 payload bytes each when the scenario
# gives no mss (MTU 1500 with TCP timestamps).
INITIAL_WINDOW = 10
SEGMENT = 1448
RTO_MIN = 0.2  # seconds: net.ipv4 tcp_rto_min, the floor of the RTO's variance term
NEW = 64  # halvings that stand for a new connection: it starts from the initial window whatever it would reach


def initial_window(mss: float | None) -> float:
    """Payload bytes of the initial congestion window of one stream (the window counts segments of payload)."""
    return INITIAL_WINDOW * (SEGMENT if mss is None else mss)


def rto(rtt: float) -> float:
    """Linux's retransmission timeout on a steady path of round trip ``rtt`` seconds."""
    return rtt + RTO_MIN


def slow_start_delay(nbytes: float, rate: float, rtt: float, start: float) -> float:
    """Seconds by which one stream's ``nbytes`` end later than at ``rate`` bytes/s, starting from a window of ``start``.

    See the module docstring: Σ (rtt − w_i / rate) over the rounds i (w_i = start·2^i) that end before the
    last byte is sent and whose window is below rate·rtt.
    """
    if nbytes <= 0 or rtt <= 0 or not math.isfinite(rate) or start <= 0:
        return 0.0
    delay, sent, window = 0.0, 0.0, start
    full = rate * rtt
    while window < full:
        sent += window
        if sent >= nbytes:  # this round holds the last byte: no wait after it
            break
        delay += rtt - window / rate
        window *= 2.0
    return delay


def had_window(in_flight: float) -> float:
    """The congestion window a stream that kept ``in_flight`` bytes in flight has when it goes idle.

    In slow start Linux grows the window while it is below twice the packets in flight
    (``tcp_is_cwnd_limited``), so a flow held back by something else (its fair rate, the send buffer,
    gloo's two segments) ends with twice what it used: ``ss`` showed 2,935 segments (4.2 MB) for a
    flow keeping 2.1 MB in flight. A flow that lost packets has less; the deep queues of the delay
    line lost none.
    """
    return 2.0 * in_flight


def halvings(idle: float, rto_s: float) -> int:
    """How often ``tcp_cwnd_restart`` halves the window after ``idle`` seconds: once per RTO beyond the first."""
    return 0 if idle <= rto_s else min(NEW, math.ceil(idle / rto_s) - 1)


def ramp_bytes(rate: float, rtt: float, start: float) -> float:
    """The bytes one stream sends in the rounds whose window is below ``rate``·``rtt``: a transfer whose bytes
    before it are more than this is past slow start, and ``slow_start_delay`` no longer grows over it."""
    if rtt <= 0 or not math.isfinite(rate) or start <= 0:
        return 0.0
    sent, window = 0.0, start
    full = rate * rtt
    while window < full:  # the rounds slow_start_delay counts, added in its order: the same float
        sent += window
        window *= 2.0
    return sent


class _Cold:
    """The ramp of each pair's connection across a plan's phases (``cold_phases``).

    Each pair's bytes sent since the connection went cold are kept exactly, added message by message in
    the plan's order. A run of one phase object repeated (a ring's phases) is worked message by message only
    until every message of it is past its pair's slow start; from then on the phase is itself, and each pair's
    additions wait in ``pending`` (its sizes in phase order, and how many repeats) until a later phase reads
    the pair, when they are made one by one, in order, so the sums are those of the plain loop.
    """

    def __init__(self, streams: int, halved: int, initial: float) -> None:
        self.streams, self.halved, self.initial = streams, halved, initial
        self.sent: dict[tuple[int, int], float] = {}
        self.pending: dict[tuple[int, int], tuple[list[float], int]] = {}
        # A ring's messages repeat (bytes, rate, round trip, bytes sent before) across its pairs and phases: each
        # distinct one is worked out once (a 1,024-device NCCL plan has 16.7M messages and few distinct ones).
        self.lateness: dict[tuple[float, float, float, float], float] = {}
        self.ramps: dict[tuple[float, float], tuple[float, float]] = {}  # (rate, rtt) -> (window start, ramp)

    def before(self, pair: tuple[int, int]) -> float:
        """The pair's bytes sent so far, its waiting additions made first."""
        waiting = self.pending.pop(pair, None)
        value = self.sent.get(pair, 0.0)
        if waiting is not None:
            sizes, repeats = waiting
            for _ in range(repeats):
                for size in sizes:
                    value += size
            self.sent[pair] = value
        return value

    def ramp(self, r: float, R: float) -> tuple[float, float]:
        hit = self.ramps.get((r, R))
        if hit is None:
            per = r / self.streams
            start = max(self.initial, had_window(per * R) / 2.0**self.halved)
            hit = self.ramps[(r, R)] = (start, ramp_bytes(per, R, start))
        return hit

    def phase(self, phase: tuple, rate: list[float], rtt: Sequence[float]) -> tuple[tuple, bool]:
        """``phase`` with each message's lateness added to its shift, and whether every message was already
        past its pair's slow start (so the phase comes back as it was, and a repeat of it would too)."""
        messages, past = [], True
        for m, r, R in zip(phase, rate, rtt):
            pair = (m[0], m[1])
            before = self.before(pair)
            self.sent[pair] = after = before + m[2]
            start, ramp = self.ramp(r, R)
            past = past and before / self.streams > ramp
            key = (m[2], r, R, before)
            late = self.lateness.get(key)
            if late is None:
                per = r / self.streams
                late = self.lateness[key] = (slow_start_delay(after / self.streams, per, R, start)
                                             - slow_start_delay(before / self.streams, per, R, start))
            shift = (m[3] if len(m) > 3 else 0.0) + late
            messages.append((m[0], m[1], m[2], shift) if shift else m)
        return (phase if past else tuple(messages)), past

    def skip(self, phase: tuple, repeats: int) -> None:
        """Add ``repeats`` runs of ``phase``, every message past its slow start, to its pairs' waiting sums."""
        sizes: dict[tuple[int, int], list[float]] = {}
        for m in phase:
            sizes.setdefault((m[0], m[1]), []).append(m[2])
        for pair, pattern in sizes.items():
            assert pair not in self.pending  # phase() read every pair of the phase at its last repeat
            self.pending[pair] = (pattern, repeats)


def cold_phases(phases: Sequence[tuple], rates: Sequence[np.ndarray], rtts: Sequence[Sequence[float]],
                streams: int, halved: int, initial: float) -> list[tuple]:
    """``phases`` with each message made later by its pair's slow start (as a fourth item: seconds of latency).

    Args:
        phases: the collective's phases of messages (src, dst, bytes[, shift]).
        rates: per phase, each message's fair rate in bytes/s when the phase runs alone.
        rtts: per phase, each message's round trip in seconds.
        streams: TCP connections a transfer is split over; each ramps on its share.
        halved: how often the window was halved while idle (``halvings``); each stream restarts from the
            congestion window it had (``had_window``) halved that often, and never below ``initial`` bytes.
        initial: the initial window in bytes.

    A phase object repeated with the same rates and round trips (a ring's) is worked out message by message
    only until all its messages are past slow start; the rest of the run is that phase as it is (``_Cold``).
    """
    cold = _Cold(streams, halved, initial)
    out: list[tuple] = []
    i, n = 0, len(phases)
    while i < n:
        phase, rate, rtt = phases[i], rates[i], rtts[i]
        end = i + 1
        while end < n and phases[end] is phase and rates[end] is rate and rtts[end] is rtt:
            end += 1
        listed = rate.tolist()
        while i < end:
            done, past = cold.phase(phase, listed, rtt)
            out.append(done)
            i += 1
            if past and i < end:  # every later repeat is past slow start too: the phase as it is
                cold.skip(phase, end - i)
                out.extend([phase] * (end - i))
                i = end
    return out
