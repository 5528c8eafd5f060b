"""A strategy's real step logic on meta tensors: every rank's events, recorded by a communicator without a network.

A rank's step is the compute it was given (``exonet.estimate.compute``) with each gradient ready in backward order
and its hooks fired then; ``run_online`` runs every rank in a thread against the online clock for a strategy
that reacts to simulated time.
"""

from __future__ import annotations

import copy
import functools
import math
import threading
from typing import Any, Callable

import torch

from exonet.communicator import Communicator, Handle, any_source_question
from exonet.estimate.compute import StepCompute
from exonet.estimate.hub import OnlineHub, RankLink
from exonet.estimate.result import scenario_for_estimate
from exonet.scenario import ScenarioLike
from exonet.strategies.base import NodeContext, Strategy
from exonet.trace import Collective, Step, Trace, coalesced


class RecordingCommunicator(Communicator):
    """A Communicator that records collectives and returns correctly shaped results, without a network."""

    def declare_groups(self, groups: Any) -> None:
        """No process groups exist without a network; remember whether the strategy uses subgroups
        (then ranks differ, as they do when it sends point-to-point)."""
        if any(len(set(group)) < self.world_size for group in groups):
            self.uses_groups = True

    def group_of(self, ranks: Any) -> Any:
        return None

    def _run(self, op: str, payload: torch.Tensor, group: Any, async_op: bool,
             launch: Callable[[bool], Any], finish: Callable[[], Any], key: str | None = None) -> Any:
        cid = self._next_cid
        self._next_cid += 1
        if op in ("send", "recv", "put", "get"):  # a peer or a key is chosen per rank: ranks differ
            self.uses_groups = True
        dtype = str(payload.dtype).removeprefix("torch.")
        self.events.append(Collective(cid, op, payload.numel() * payload.element_size(), self._members(group),
                                      async_op, dtype, key=key))
        if async_op:
            return Handle(self, cid, None, finish)
        return finish()

    def _flush_compute(self) -> float:
        """Compute is injected per step by the estimator, never measured here (now, as the base returns)."""
        return self.now()

    def recv_any(self, tensor: torch.Tensor | Callable[[int], torch.Tensor]) -> tuple[int, float] | None:
        """Ask the online clock who is received first (as ``Communicator.recv_any``); nothing is received."""
        if self.clock is None:
            return super().recv_any(tensor)  # its error: the online clock is needed
        cid = self._next_cid
        self._next_cid += 1
        events, self.events = self.events, []
        answer = self.clock.ask(any_source_question(cid, tensor), events)
        if answer is not None and callable(tensor):
            tensor(answer[0])  # the sender's buffer: the strategy reads which message it is
        return answer


@functools.lru_cache(maxsize=4096)
def meta_grad(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A meta gradient of this shape, shared by every rank and step: it has no storage to share, and building one
    costs as much as a rank's step (a thousand ranks of a hundred tensors took 4.5 s)."""
    return torch.empty(shape, dtype=dtype, device="meta")


def fire_grad_hooks(p: torch.nn.Parameter) -> None:
    """Run ``p``'s post-accumulate-grad hooks, as autograd does once its gradient is accumulated.

    Meta tensors have no real backward pass worth its cost (milliseconds per step), so the
    estimator fires the hooks itself in backward order.
    """
    hooks = getattr(p, "_post_accumulate_grad_hooks", None) or {}
    for hook in hooks.values():
        hook(p)


def run_rank(strategy: Strategy, make_model: Callable[[], torch.nn.Module], rank: int, nodes: int, steps: int,
              compute: StepCompute, hub: OnlineHub | None = None, merge: bool = False) -> tuple[list, bool]:
    """One rank's events, and whether its strategy declared subgroups (then ranks differ).

    With ``hub`` (an asynchronous strategy) each step's events are reported to the online clock
    instead (the hub keeps them), and a server rank serves instead of training. ``merge``: when no gradient
    has a hook (nothing happens between the spans), the forward and backward go in as one span (``coalesced``).
    """
    strat = copy.deepcopy(strategy)
    model = make_model()  # a model of its own: the strategy registers hooks on it
    world = nodes + (strategy.servers if hub is not None else 0)
    comm = RecordingCommunicator(rank, world, torch.device("meta"))
    if hub is not None:
        comm.clock = RankLink(hub, rank)
    strat.setup(model, comm, NodeContext(rank, nodes, steps, 0, torch.device("meta")))
    if rank >= nodes:  # a server: its own work takes no simulated time
        strat.serve(lambda updates, sim_time_s: None)
        assert hub is not None  # only an asynchronous run has servers (ranks from nodes on)
        hub.report(rank, comm.events, done=True)
        return [], True
    # local numerics never change what goes on the wire
    strat.optimizer.step = lambda *a, **k: None  # type: ignore[method-assign, assignment]
    params = [p for p in model.parameters() if p.requires_grad]
    grads = [meta_grad(tuple(p.shape), p.dtype) for p in params]
    # the hooks a strategy registered in setup (DDP's buckets ...): the only gradients whose arrival does anything
    hooked = [bool(getattr(p, "_post_accumulate_grad_hooks", None)) for p in params]
    whole = coalesced([compute.forward, *(span for _, span in compute.backward)]) if merge and not any(hooked) else None
    events: list = []
    for _ in range(steps):
        strat.zero_grad()
        strat.prepare_backward(True)
        traced = not comm.sitting_out  # an elastic node that is down: its work is not the run's (as in fit)
        if whole is not None:
            if traced:
                comm.events.extend(whole)
            for p, grad in zip(params, grads):
                p.grad = grad
        else:
            if traced:
                comm.events.append(compute.forward)
            for i, span in compute.backward:
                if traced:
                    comm.events.append(span)
                params[i].grad = grads[i]
                if hooked[i]:
                    fire_grad_hooks(params[i])
        strat.step()
        if traced and compute.tail is not None:  # a measured step's optimizer and the rest, after the strategy's
            comm.events.append(compute.tail)
        comm.events.append(Step())
        if hub is not None:
            hub.report(rank, comm.events)
        else:
            events.extend(comm.events)
        comm.events = []
    strat.finish()
    if hub is not None:
        hub.report(rank, comm.events, done=True)
        return [], True
    events.extend(comm.events)
    return events, getattr(comm, "uses_groups", False)


def run_online(strategy: Strategy, make_model: Callable[[], torch.nn.Module], nodes: int, steps: int,
                computes: list[StepCompute], scenario: ScenarioLike) -> Trace:
    """Every rank (trainers, then servers) in a thread against the online clock in ``scenario``; their trace."""
    from exonet.runtime.clock import SimClock

    chosen = scenario_for_estimate(scenario)
    world = nodes + strategy.servers
    elastic = strategy.elastic  # its failed nodes discard their own work, as in fit
    hub = OnlineHub(SimClock(chosen, world, math.inf, steps, trainers=nodes, synchronous=False,
                             what=type(strategy).__name__, given_compute=True, rewind=not elastic), world)

    def run(rank: int) -> None:
        hub.enter()
        try:
            run_rank(strategy, make_model, rank, nodes, steps, computes[min(rank, nodes - 1)], hub)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            hub.fail(exc)
        finally:
            hub.leave()

    threads = [threading.Thread(target=run, args=(r,), name=f"estimate-rank-{r}", daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if hub.error is not None:
        raise hub.error
    meta = {"estimate": True, "strategy": type(strategy).__name__, "servers": strategy.servers,
            "decided_in": {"scenario": chosen.name, "fingerprint": chosen.fingerprint}}
    if elastic:
        meta["elastic"] = True
    return Trace(meta=meta, events=hub.events, num_ranks=world)
