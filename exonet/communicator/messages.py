"""Messages between ranks and objects in a store: send, recv, a batch of both, put and get, and recv_any.

Mixed into ``Communicator``; each is traced as the collectives are (``CommCore._run``), with its peer or key.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch.distributed import distributed_c10d as dist

from exonet.communicator.core import CommCore, Handle
from exonet.communicator.questions import any_source_question

P2P_KINDS = {"send": dist.isend, "recv": dist.irecv}  # batch_isend_irecv's kinds and torch's posting calls


def _posted(work: Any) -> Callable[[bool], Any]:
    """A launch that returns a transfer already posted (``batch_isend_irecv`` posts the group in one call)."""
    return lambda _async: work


class _StoreRead:
    """A get in flight: ``wait()`` reads the key into the tensor once it is there."""

    def __init__(self, comm: Messages, key: str, tensor: torch.Tensor) -> None:
        self.comm, self.key, self.tensor = comm, key, tensor

    def wait(self) -> None:
        self.comm._store().get(self.key, self.tensor)

    def is_completed(self) -> bool:
        return bool(self.comm._store().ready(self.key))


class Messages(CommCore):
    """Point-to-point messages and the object store, for one rank."""

    def send(self, tensor: torch.Tensor, dst: int, async_op: bool = False) -> Any:
        """Send ``tensor`` to global rank ``dst``, which must ``recv`` it (the k-th send to dst, its k-th recv).

        Counted as this rank's payload; simulated as one message on this rank's uplink, any
        inter-region link and ``dst``'s downlink. Returns the tensor, or a Handle.
        """
        self._check_peer("send", dst)
        buf, finish = self._p2p_buffer("send", tensor)
        return self._run("send", tensor, (self.rank, dst), async_op,
                         lambda a: dist.isend(buf, dst) if a else dist.send(buf, dst), finish)

    def recv(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> Any:
        """Receive into ``tensor`` what global rank ``src`` sends; returns it (or a Handle whose wait() does)."""
        self._check_peer("recv", src)
        out, finish = self._p2p_buffer("recv", tensor)
        return self._run("recv", tensor, (src, self.rank), async_op,
                         lambda a: dist.irecv(out, src) if a else dist.recv(out, src), finish)

    def batch_isend_irecv(self, ops: Sequence[tuple[str, torch.Tensor, int]]) -> list[Handle]:
        """Post every ``("send" | "recv", tensor, peer)`` at once, as torch's ``batch_isend_irecv`` (NCCL runs them
        as one group); returns a Handle per op, in order, whose ``wait()`` gives its tensor.

        Each is traced as an async send or recv, so the replay runs the group's transfers together, sharing
        the NICs, and the rank blocks where it waits on them.
        """
        posted = []
        for i, op in enumerate(ops):
            if not (isinstance(op, tuple) and len(op) == 3 and op[0] in P2P_KINDS):
                raise ValueError(f"batch_isend_irecv: ops[{i}] must be ('send' | 'recv', tensor, peer), got {op!r}")
            kind, tensor, peer = op
            self._check_peer(kind, peer)
            posted.append((kind, tensor, peer, *self._p2p_buffer(kind, tensor)))
        works = dist.batch_isend_irecv([dist.P2POp(P2P_KINDS[kind], buf, peer) for kind, _, peer, buf, _ in posted])
        return [self._run(kind, tensor, (self.rank, peer) if kind == "send" else (peer, self.rank), True,
                          _posted(work), finish)
                for (kind, tensor, peer, _, finish), work in zip(posted, works)]

    def put(self, key: str, tensor: torch.Tensor) -> None:
        """Write ``tensor`` to the object store under ``key`` (each key once); ``get`` reads it on any rank.

        Traced as a put of the tensor's bytes: in a replay it travels once from this node to the store
        (``[store]`` in the scenario), however many nodes read it.
        """
        self._store_op("put")
        self._run("put", tensor, None, False, lambda _: self._store().put(key, tensor), lambda: None, key=key)

    def get(self, key: str, tensor: torch.Tensor, async_op: bool = False) -> Any:
        """Fill ``tensor`` with the object ``key`` once some rank has put it; returns ``tensor`` (or a Handle).

        A key no rank puts ends the run after fit's ``timeout_s``, naming the key and this rank.
        """
        self._store_op("get")
        read = _StoreRead(self, key, tensor)
        return self._run("get", tensor, None, async_op, lambda a: read if a else read.wait(), lambda: tensor, key=key)

    def _store_op(self, op: str) -> None:
        if self.clock is not None and self.clock.announces:
            raise NotImplementedError(f"comm.{op}: the online clock (an asynchronous strategy, or max_sim_time_s) "
                                      "does not model the object store; replay the run with simulate() instead")

    def _store(self) -> Any:
        if self.object_store is None:
            raise RuntimeError(f"comm.put/get on rank {self.rank}: this run has no object store (a fit on one machine "
                               "has one; a multi-host torchrun run shares no directory)")
        return self.object_store

    def _p2p_buffer(self, kind: str, tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[], torch.Tensor]]:
        """The contiguous host-readable buffer a send reads or a receive fills, and what returns ``tensor`` after."""
        buf, copy_back = self._staged(tensor)
        out = buf.contiguous()
        if kind == "send":
            return out, lambda: tensor

        def finish() -> torch.Tensor:
            if out is not buf:
                buf.copy_(out)
            copy_back(buf)
            return tensor

        return out, finish

    def recv_any(self, tensor: torch.Tensor | Callable[[int], torch.Tensor]) -> tuple[int, float] | None:
        """Receive into ``tensor`` the message that arrives first in simulated time, from any rank.

        The online clock decides (a parameter server applies updates in simulated arrival
        order, whatever order the real processes send in); the trace records a plain recv
        from that rank. Returns (sender, simulated seconds it was received), or None once no
        message can come (every other rank has finished). Needs the online clock: a run of a
        strategy with a server, given a scenario. ``tensor`` may be a function of the sender
        giving the buffer, for messages whose size depends on who sends (Decoupled DiLoCo's
        fragments); the trace's recv then records 0 bytes and the replay times the send's.
        """
        if self.clock is None:
            raise RuntimeError("recv_any: the online clock decides who is received first; it runs for strategies "
                               "with a server (Strategy.servers) given fit(scenario=...)")
        self._flush_compute()
        cid = self._next_cid
        self._next_cid += 1
        events, self.events = self.events, []
        answer = self.clock.ask(any_source_question(cid, tensor), events)
        if answer is not None:
            if callable(tensor):
                tensor = tensor(answer[0])
            buf, copy_back = self._staged(tensor)
            out = buf.contiguous()
            with self.blocking("recv", answer[0], cid):
                dist.recv(out, answer[0])
            if out is not buf:
                buf.copy_(out)
            copy_back(buf)
        self._restart_clock()
        return answer

    def _check_peer(self, op: str, peer: int) -> None:
        if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < self.world_size or peer == self.rank:
            raise ValueError(f"{op}: the peer must be another rank in [0, {self.world_size}), got {peer!r}")
