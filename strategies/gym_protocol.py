"""A strategy object with the seed gym's protocol, run as the gym's trainer ran it, whatever its base class.

Strategies shared as files in the field subclass the seed gym's ``Strategy`` (exo-explore/gym,
``exogym/strategy/strategy.py``) or their own copy of it: ``_init_node(model, rank, num_nodes)``, then per
step ``zero_grad()``, forward and backward, ``step()``; they keep ``optim`` (and ``scheduler``), read
``max_steps`` and call ``lr_callbacks``, and talk through ``torch.distributed`` directly. ``GymProtocol``
drives such an object inside exonet's node the same way; its ``torch.distributed`` calls are counted and
traced by the node (``exonet.runtime.dist_calls``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from exonet.strategies.base import NodeContext, Strategy

if TYPE_CHECKING:
    from exonet.communicator import Communicator

PROTOCOL = ("_init_node", "step", "zero_grad")


def has_gym_protocol(obj: Any) -> bool:
    """Whether ``obj`` is a gym-protocol strategy (and not an exonet Strategy)."""
    return not isinstance(obj, Strategy) and all(callable(getattr(obj, name, None)) for name in PROTOCOL)


class GymProtocol(Strategy):
    """Runs ``inner``, an object with the seed gym's protocol, as the gym's trainer did.

    Before ``_init_node`` it sets ``inner.max_steps`` (the gym's trainer did; its lr lambda reads it). A
    checkpoint keeps ``inner.optim``'s and ``inner.scheduler``'s state and its ``local_step``; anything else the
    object holds (a master copy on rank 0, its own buffers) starts afresh on resume.

    Args:
        inner: the gym-protocol strategy object.
    """

    name = "gym"

    def __init__(self, inner: Any) -> None:
        super().__init__()
        missing = [name for name in PROTOCOL if not callable(getattr(inner, name, None))]
        if missing:
            raise TypeError(f"strategy: {type(inner).__name__} has no {', '.join(missing)}(): a strategy is an "
                            "exonet.strategies.Strategy or an object with the seed gym's _init_node, step and "
                            "zero_grad")
        self.inner = inner

    def __repr__(self) -> str:
        return f"GymProtocol({type(self.inner).__name__})"

    def setup(self, model: torch.nn.Module, comm: Communicator, ctx: NodeContext) -> None:
        super().setup(model, comm, ctx)
        self.inner.max_steps = ctx.max_steps
        self.inner._init_node(model, ctx.rank, ctx.num_nodes)

    def zero_grad(self) -> None:
        self.inner.zero_grad()

    def step(self) -> None:
        self.inner.step()

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"local_step": self.local_step, "inner_step": getattr(self.inner, "local_step", None)}
        for part in ("optim", "scheduler"):
            held = getattr(self.inner, part, None)
            if held is not None:
                state[part] = held.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.local_step = state["local_step"]
        if state["inner_step"] is not None:
            self.inner.local_step = state["inner_step"]
        for part in ("optim", "scheduler"):
            if part in state:
                getattr(self.inner, part).load_state_dict(state[part])


def as_strategy(obj: Any) -> Any:
    """``obj`` itself, or wrapped in ``GymProtocol`` when it has the seed gym's protocol."""
    return GymProtocol(obj) if has_gym_protocol(obj) else obj
