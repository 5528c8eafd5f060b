"""Messages: when a point-to-point message may go, when its sender is free, and any-source receives.

Mixed into ``Simulation`` (exonet.netsim.engine). Under NCCL and the phase model a message starts
with its sender alone and both sides are done when it is delivered. Under gloo it is a rendezvous,
as the delay line measured (``exonet.validate.stages``): gloo's unbound send holds its data until
the receiver's ``recv`` has notified the sender (``Pair::sendUnboundBuffer``), the notice rides the
pair's one connection behind the receiver's own data to that sender and, being data, keeps that
side from idling, and a send is done once its last byte has left. An any-source receive notifies
every sender at once; it takes the first-delivered message at the head of a channel.
"""

from __future__ import annotations

from exonet.netsim.agenda import seconds, ticks
from exonet.netsim.simstate import SimState
from exonet.netsim.state import Instance, RankState


class Messages(SimState):
    """Point-to-point messages: their start under each backend, their sender's release, any-source receives."""

    def _post(self, rk: RankState, c: Instance, side: str) -> None:
        """``rk`` posts its side of message ``c``. It starts with its sender alone (NCCL, the phase model) or, under
        gloo, once the receiver's recv-ready notice has reached the sender, whose data waits for it: at
        max(send, recv + one-way latency). gloo's unbound send is a rendezvous (``Pair::sendUnboundBuffer`` holds
        the data until the peer's ``recv`` notifies it), so a stage that receives micro-batch by micro-batch
        pays a round trip for each (measured: ``exonet.validate.stages``)."""
        if not self._rendezvous:
            if side == "send":
                self._queue_start(c)
            return
        sender, receiver = c.members
        if side == "recv":
            c.ready = self._notice(rk.t, c)
        elif len(c.ranks) < 2:
            waiting = self._any.get(receiver)  # an any-source receive has told every sender it is ready
            if waiting is None:
                self._unmatched.setdefault(receiver, []).append(c)
                return
            c.ready = waiting.block_t + ticks(self._topo.path(receiver, sender).latency)
            return self._go(c)
        if side == "recv" and len(c.ranks) == 2:
            self._unmatched[receiver].remove(c)
        if len(c.ranks) == 2 and c.ready >= 0:  # both posted, and the notice's arrival known (see _notice)
            self._go(c)

    def _go(self, c: Instance) -> None:
        """Gloo message ``c`` may go: its bytes go on the connection at max(send, notice), until sent."""
        c.last = max(c.last, c.ready)
        self._on_wire.setdefault(c.members, []).append(c)
        self._queue_start(c)

    def _notice(self, t: int, c: Instance) -> int:
        """When the recv-ready notice for gloo message ``c``, sent at tick ``t``, reaches the sender; -1 while it
        queues behind the receiver's own data to that sender on their one connection (``_sent`` then says).

        The notice is the receiver's data on that connection: it keeps its side from idling (Linux restarts slow
        start only after an RTO with nothing sent)."""
        sender, receiver = c.members
        back = (receiver, sender)
        if back in self._group_end:
            self._group_end[back] = max(self._group_end[back], t)
        ahead = [m for m in self._on_wire.get(back, ()) if m.last <= t]
        if ahead:
            self._behind.setdefault(ahead[-1], []).append(c)
            return -1
        return t + ticks(self._topo.path(receiver, sender).latency)

    def _sending_until(self, c: Instance, end: int) -> None:
        """A gloo message ending (delivered) at tick ``end`` frees its sender a path latency earlier, when its last
        byte has left: a send is done once its data is on the wire, not once it has arrived."""
        if self._rendezvous and c.op == "p2p" and c.sent < 0:  # (a message resting again may have sent already)
            sender, receiver = c.members
            self._agenda.at(end - ticks(self._topo.path(sender, receiver).latency), self._sent, c, c.token)

    def _sent(self, t: int, c: Instance, token: int | None = None) -> None:
        """The last byte of gloo message ``c`` has left its sender: a sender waiting on it goes on."""
        if (token is not None and token != c.token) or c.sent >= 0 or c.done:
            return
        c.sent = t
        self._on_wire[c.members].remove(c)
        for m in self._behind.pop(c, ()):  # notices that queued behind its bytes now go
            m.ready = t + ticks(self._topo.path(m.members[1], m.members[0]).latency)
            if len(m.ranks) == 2:
                self._go(m)
        sender = [rk for rk in c.waiters if rk.rank == c.members[0]]
        if sender:
            c.waiters.remove(sender[0])
            self._release(sender[0], c)
            self._advance(sender[0])

    def _claim(self, t: int, rk: RankState) -> None:
        """``rk``'s any-source receive takes the first-delivered message at the head of a channel, or waits."""
        heads = [c for c in self._inbox.get(rk.rank, ()) if rk.counts.get(c.key[0], 0) == c.key[1]]
        if not heads:
            self._any[rk.rank] = rk
            for c in self._unmatched.pop(rk.rank, ()):  # gloo: the receive tells every sender it is ready
                c.ready = t + ticks(self._topo.path(rk.rank, c.members[0]).latency)
                self._go(c)
            return
        c = min(heads, key=lambda m: (m.end, m.members[0]))
        self._inbox[rk.rank].remove(c)
        rk.counts[c.key[0]] = c.key[1] + 1
        c.ranks.append(rk.rank)
        del self._open[c.key]
        self._received.setdefault(rk.rank, []).append((c.members[0], seconds(max(c.end, rk.block_t))))
        rk.blocked = None
        self._block(rk, c)
        self._advance(rk)
