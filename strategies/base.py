"""Strategy and OptimSpec: the base every algorithm builds on.

A Strategy is constructed in the parent (where every argument is validated), pickled
to each node, then ``setup`` gives it the node's model and Communicator. The node's
loop is: ``zero_grad()``, forward/backward, ``step()``. ``step`` owns the optimizer
step and all communication, and talks to the network only through ``self.comm``.
"""

from __future__ import annotations

import abc
import functools
import inspect
import math
import warnings
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch

from exonet.arguments import check_int, check_range, one_of
from exonet.runtime.forkserver import complete_imports
from exonet.seeding import shared_generator
from exonet.strategies.compat import accept_gym_spellings
from exonet.strategies.muon import MuonAdamW

if TYPE_CHECKING:
    from exonet.communicator import Communicator

__all__ = ["BASE_OPTIONS", "OPTIMIZERS", "BaseOptions", "NodeContext", "OptimSpec", "Strategy", "check_int",
           "check_range", "flatten", "one_of", "outer_spec", "shared_generator", "unflatten_into"]

OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD,
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "adagrad": torch.optim.Adagrad,
    "adadelta": torch.optim.Adadelta,
    "adamax": torch.optim.Adamax,
    "asgd": torch.optim.ASGD,
    "nadam": torch.optim.NAdam,
    "radam": torch.optim.RAdam,
    "rmsprop": torch.optim.RMSprop,
    "rprop": torch.optim.Rprop,
    "muon": MuonAdamW,  # Muon on 2-D weights, AdamW on the rest (exonet.strategies.muon)
}


def _torch_checks(cls: type[torch.optim.Optimizer], kwargs: dict[str, Any]) -> None:
    """Let torch check ``kwargs`` here, not in a node: built with no parameters, a torch optimizer checks its
    arguments, then stops at the empty list before its first parameter group, whose ``add_param_group``
    imports ``torch._dynamo`` (0.8 s, which the forked nodes have preloaded). Not for the arguments some
    torch versions accept only with device tensors (``fused``, ``capturable``)."""
    try:
        cls([], **kwargs)
    except (ValueError, TypeError) as exc:
        if str(exc) == _NO_PARAMETERS:
            return
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        raise type(exc)(f"OptimSpec: {cls.__name__}({args}) is rejected by torch: {exc}") from None


_NO_PARAMETERS = "optimizer got an empty parameter list"


class OptimSpec:
    """A torch optimizer class (or its name) plus keyword arguments, built per node.

    Keyword arguments are checked against the optimizer's signature here, in the
    parent, so a misspelt argument is an error rather than silently ignored.

    Args:
        cls_or_name: a ``torch.optim.Optimizer`` subclass or a name such as "adamw".
        **kwargs: passed to the optimizer's constructor (``lr``, ``weight_decay`` ...).
    """

    def __init__(self, cls_or_name: str | type[torch.optim.Optimizer] = "adamw", **kwargs: Any) -> None:
        if isinstance(cls_or_name, str):
            key = cls_or_name.lower()
            if key not in OPTIMIZERS:
                raise ValueError(
                    f"OptimSpec: unknown optimizer {cls_or_name!r}; valid names: {', '.join(sorted(OPTIMIZERS))}"
                    " (or pass a torch.optim.Optimizer subclass)"
                )
            cls = OPTIMIZERS[key]
        elif isinstance(cls_or_name, type) and issubclass(cls_or_name, torch.optim.Optimizer):
            cls = cls_or_name
        else:
            raise TypeError("OptimSpec: expected an optimizer name or torch.optim.Optimizer subclass, "
                            f"got {cls_or_name!r}")
        params = inspect.signature(cls.__init__).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            unknown = sorted(set(kwargs) - set(params) - {"self", "params"})
            if unknown:
                valid = [p for p in params if p not in ("self", "params")]
                raise TypeError(f"OptimSpec: {cls.__name__} has no argument {', '.join(unknown)}; "
                                f"valid: {', '.join(valid)}")
        if cls.__module__.startswith("torch.optim") and not {"fused", "capturable"} & set(kwargs):
            _torch_checks(cls, kwargs)
        self.cls = cls
        self.kwargs = dict(kwargs)

    @classmethod
    def coerce(cls, value: "OptimSpec | str | type | None", argument: str, default: "OptimSpec") -> "OptimSpec":
        """Accept an OptimSpec, an optimizer name or class; ``argument`` names the caller's parameter in errors."""
        if value is None:
            return default
        if isinstance(value, OptimSpec):
            return value
        try:
            return cls(value)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{argument}: {exc}") from None

    @property
    def lr(self) -> float | None:
        return self.kwargs.get("lr")

    def build(self, params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
        complete_imports(("torch._dynamo",))  # the first optimizer imports it: whole, even if Ctrl-C comes meanwhile
        return self.cls(params, **self.kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {"optimizer": self.cls.__name__, **{k: _jsonable(v) for k, v in self.kwargs.items()}}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"OptimSpec({self.cls.__name__}{', ' if args else ''}{args})"


def _jsonable(v: Any) -> Any:
    return v if isinstance(v, (int, float, str, bool, type(None), list, dict)) else repr(v)


@dataclass(frozen=True)
class BaseOptions:
    """What every strategy takes besides its optimizer and its own hyperparameters: clipping and the lr schedule.

    A subclass's constructor leaves them out: ``Strategy.__init_subclass__`` appends them to its signature
    (keyword-only, so it stays complete for users and tools) and applies the ones given once it has run.
    """

    max_norm: float | None = None
    lr_scheduler: str | type | None = None
    lr_scheduler_kwargs: dict[str, Any] | None = None
    warmup_steps: int = 0
    cosine_min_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.max_norm is not None:
            check_range("max_norm", self.max_norm, low=0, low_open=True)
        if self.lr_scheduler == "lambda_cosine":  # the seed gym's schedule, its defaults and its arithmetic
            unknown = set(self.lr_scheduler_kwargs or {}) - set(GYM_LAMBDA_COSINE)
            if unknown:
                raise ValueError(f"lr_scheduler_kwargs: 'lambda_cosine' takes {', '.join(GYM_LAMBDA_COSINE)}, "
                                 f"not {', '.join(sorted(unknown))}")
        elif self.lr_scheduler is not None and self.lr_scheduler != "cosine" and not (
            isinstance(self.lr_scheduler, type)
            and issubclass(self.lr_scheduler, torch.optim.lr_scheduler.LRScheduler)
        ):
            raise ValueError(f"lr_scheduler must be None, 'cosine', 'lambda_cosine' or a torch LRScheduler class, "
                             f"got {self.lr_scheduler!r}")
        check_int("warmup_steps", self.warmup_steps, low=0)
        check_range("cosine_min_ratio", self.cosine_min_ratio, low=0, high=1)
        _check_schedule_options(self.lr_scheduler, self.lr_scheduler_kwargs, self.warmup_steps,
                                self.cosine_min_ratio)


BASE_OPTIONS = tuple(f.name for f in fields(BaseOptions))


def _with_base_options(cls: type) -> None:
    """Give ``cls``'s constructor the base options, unless it names them itself (or takes ``**kwargs``)."""
    init = cls.__dict__.get("__init__")
    if init is None:
        return
    signature = inspect.signature(init)
    params = signature.parameters
    if set(BASE_OPTIONS) & set(params) or any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    options = [p for name, p in inspect.signature(Strategy.__init__).parameters.items() if name in BASE_OPTIONS]

    @functools.wraps(init)
    def with_options(self: Strategy, *args: Any, **kwargs: Any) -> None:
        given = {name: kwargs.pop(name) for name in BASE_OPTIONS if name in kwargs}
        init(self, *args, **kwargs)
        if given:
            self.set_options(BaseOptions(**given))

    with_options.__signature__ = signature.replace(parameters=[*params.values(), *options])  # type: ignore[attr-defined]
    cls.__init__ = with_options  # type: ignore[misc]


def _counting_steps(cls: type[Strategy]) -> None:
    """Make ``cls.step`` count ``local_step``: one more as each step returns, wherever it is called from.

    The node loop, ``estimate``, the bench and tests all call ``step()``; counting here means no strategy has
    to remember ``self.local_step += 1``. Inside ``step()`` the count is the steps done before this one. As in
    the seed gym, a step that calls ``super().step()`` sees the count go up when that returns (the innermost
    step counts, once). A strategy that still counts itself (written before the base class did) keeps its
    count, with a DeprecationWarning once per class.
    """
    step = cls.__dict__.get("step")
    if step is None or getattr(step, "__isabstractmethod__", False):
        return

    @functools.wraps(step)
    def counted(self: Strategy) -> None:
        outermost = not self._stepping
        if outermost:
            self._stepping, self._step_counted = True, False
        before = self.local_step
        try:
            step(self)
        finally:
            if outermost:
                self._stepping = False
        if self._step_counted:
            return
        self._step_counted = True
        if self.local_step == before:
            self.local_step += 1
        elif type(self) not in _COUNTING_THEMSELVES:
            _COUNTING_THEMSELVES.add(type(self))
            warnings.warn(f"{type(self).__name__}.step counts local_step itself; the base class counts it now "
                          "(remove `self.local_step += 1`: it is counted twice from the next release)",
                          DeprecationWarning, stacklevel=2)

    cls.step = counted  # type: ignore[method-assign]


_COUNTING_THEMSELVES: set[type] = set()


def _default_inner() -> OptimSpec:
    return OptimSpec("adamw", lr=1e-3)


def outer_spec(outer_optim_spec: OptimSpec | str | type | None) -> OptimSpec:
    """DiLoCo's outer optimizer; the default is the DiLoCo paper's SGD lr 0.7, momentum 0.9, Nesterov."""
    return OptimSpec.coerce(outer_optim_spec, "outer_optim_spec", OptimSpec("sgd", lr=0.7, momentum=0.9, nesterov=True))


@dataclass(frozen=True)
class NodeContext:
    """What a strategy may know about its node: rank, world, step budget, seed, device."""

    rank: int
    num_nodes: int
    max_steps: int
    seed: int
    device: torch.device


class Strategy(abc.ABC):
    """Base class: owns the node's optimizer, gradient clipping and learning-rate schedule.

    Subclasses implement ``step()`` (called after backward) and talk to other nodes
    only through ``self.comm``. The base class counts ``local_step`` as each ``step()`` returns
    (inside it, the steps done before this one). The runtime (``fit``, ``estimate``) reads the
    class attributes below and ``asynchronous``; a subclass overrides the ones it changes.

    Args:
        optim_spec: the (inner) optimizer; a name, class or OptimSpec. Default AdamW lr 1e-3.
        max_norm: clip the gradient norm to this value before the optimizer step (None = no clipping).
        lr_scheduler: None, "cosine", or a ``torch.optim.lr_scheduler.LRScheduler`` subclass
            ("lambda_cosine" with ``lr_scheduler_kwargs={"warmup_steps", "cosine_anneal"}`` is the seed
            gym's spelling of a warm-up plus cosine).
        lr_scheduler_kwargs: keyword arguments for a scheduler class.
        warmup_steps: linear warm-up length (with None or "cosine").
        cosine_min_ratio: the cosine schedule's floor as a fraction of the base lr.

    Attributes:
        name: a run's default label, ``<name>-k<K>`` (fit's ``run_name``).
        servers: ranks after the K trainers that serve instead of training; they run ``serve``
            (exonet.strategies.server).
        elastic: whether a node that fails discards its own work while the others go on without it
            (fit and estimate then replay failures that way).
    """

    name: str = "strategy"
    servers: int = 0
    elastic: bool = False
    _stepping = False  # inside step(), and whether this step is counted yet (a super().step() counts it)
    _step_counted = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _with_base_options(cls)
        _counting_steps(cls)
        # the older gym's shared arguments and aliases, exonet's deprecated spellings (exonet.strategies.compat)
        accept_gym_spellings(cls, OptimSpec)

    def __init__(
        self,
        optim_spec: OptimSpec | str | type | None = None,
        *,
        max_norm: float | None = None,
        lr_scheduler: str | type | None = None, lr_scheduler_kwargs: dict[str, Any] | None = None,
        warmup_steps: int = 0, cosine_min_ratio: float = 0.0,
    ) -> None:
        self.optim_spec = OptimSpec.coerce(optim_spec, "optim_spec", _default_inner())
        self.set_options(BaseOptions(max_norm, lr_scheduler, lr_scheduler_kwargs, warmup_steps, cosine_min_ratio))

    def set_options(self, options: BaseOptions) -> None:
        """Take the (checked) base options: clipping and the learning-rate schedule."""
        self.max_norm = options.max_norm
        self.lr_scheduler = options.lr_scheduler
        self.lr_scheduler_kwargs = dict(options.lr_scheduler_kwargs or {})
        self.warmup_steps = options.warmup_steps
        self.cosine_min_ratio = options.cosine_min_ratio

    # ------------------------------------------------------------ node side
    def setup(self, model: torch.nn.Module, comm: "Communicator", ctx: NodeContext) -> None:
        """Bind to this node's model and communicator; build the optimizer and schedule."""
        self.model = model
        self.comm = comm
        self.ctx = ctx
        self.rank = ctx.rank
        self.num_nodes = ctx.num_nodes
        self.params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
        self.local_step = 0
        self.optimizer = self.optim_spec.build(self.inner_param_groups())
        self.scheduler = self._build_scheduler(self.optimizer, ctx.max_steps)

    def inner_param_groups(self) -> list[Any]:
        """What the inner optimizer is built on: ``self.params``, or param groups a strategy tags (MuLoCo's)."""
        return list(self.params)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def asynchronous(self) -> bool:
        """Whether the simulated clock decides who syncs when (a server, deadline rounds).

        Such a run needs the online clock (a scenario): its trainers decide their steps on their
        own, and every blocking call reports its events first (exonet.runtime.clock).
        """
        return self.servers > 0

    def check_world(self, num_nodes: int) -> None:
        """Reject arguments that cannot work with ``num_nodes`` nodes (called by ``fit`` before any node starts)."""

    def prepare_backward(self, sync: bool) -> None:
        """Called before each backward pass of a step; ``sync`` is True for the one that completes its gradient.

        With gradient accumulation only the last micro-batch's backward has ``sync``: a
        strategy that communicates from gradient hooks (overlapped DDP) starts then, and not
        during the bookkeeping passes (FLOP counting) either.
        """

    def serve(self, updated: Callable[[int, float], None]) -> None:
        """A server rank's whole life (ranks from ``num_nodes`` on): the node calls it instead of the training loop.

        A strategy with ``servers > 0`` overrides it (ServerStrategy does): it calls ``updated(n, sim_time_s)``
        after the n-th update of the parameters it serves, so the node can evaluate them.
        """
        raise NotImplementedError(f"{type(self).__name__} declares servers = {self.servers} but has no serve(); "
                                  "subclass exonet.strategies.server.ServerStrategy")

    @abc.abstractmethod
    def step(self) -> None:
        """Apply one training step after backward (optimizer step plus communication)."""

    def finish(self) -> None:
        """Complete any communication still in flight at the end of training."""

    def optimizer_step(self) -> None:
        """Clip, step the optimizer and the schedule: the purely local part every strategy shares."""
        if self.max_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.max_norm)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        state = {"local_step": self.local_step, "optimizer": self.optimizer.state_dict()}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.local_step = state["local_step"]
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])

    # ---------------------------------------------------------- description
    def config(self) -> dict[str, Any]:
        """JSON-able description of the strategy and its hyperparameters (for config.json)."""
        out: dict[str, Any] = {"strategy": type(self).__name__}
        for k, v in vars(self).items():
            if k.startswith("_") or k in ("model", "comm", "ctx", "params", "optimizer", "scheduler"):
                continue
            if isinstance(v, OptimSpec):
                out[k] = v.to_dict()
            elif _plain(v):  # scalars, and dicts/lists of them: lr_scheduler_kwargs, groups
                out[k] = v
            elif isinstance(v, type):
                out[k] = v.__name__
        return out

    def _build_scheduler(self, optimizer: torch.optim.Optimizer, max_steps: int):
        if isinstance(self.lr_scheduler, type):
            return self.lr_scheduler(optimizer, **self.lr_scheduler_kwargs)
        if self.lr_scheduler == "lambda_cosine":
            return torch.optim.lr_scheduler.LambdaLR(optimizer, gym_lambda_cosine(self.lr_scheduler_kwargs, max_steps))
        if self.lr_scheduler is None and self.warmup_steps == 0:
            return None
        warmup, floor, cosine = self.warmup_steps, self.cosine_min_ratio, self.lr_scheduler == "cosine"

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            if not cosine:
                return 1.0
            progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# the seed gym's lambda_cosine: its keys and defaults
def _plain(value: Any) -> bool:
    """Whether ``value`` is JSON as it stands: a scalar, or a dict (string keys) or list/tuple of such values."""
    if isinstance(value, (int, float, str, bool, type(None))):
        return True
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return isinstance(value, (list, tuple)) and all(_plain(v) for v in value)


def _check_schedule_options(lr_scheduler: str | type | None, kwargs: dict[str, Any] | None, warmup_steps: int,
                            cosine_min_ratio: float) -> None:
    """Each schedule reads its own options: one given to another would be ignored, so it is an error."""
    own = lr_scheduler is None or lr_scheduler == "cosine"  # exonet's warm-up and cosine
    if kwargs and own:
        raise ValueError(f"lr_scheduler_kwargs={kwargs!r} are for a scheduler class or 'lambda_cosine'; "
                         f"lr_scheduler={lr_scheduler!r} takes warmup_steps= and cosine_min_ratio= (its length is "
                         "fit's max_steps)")
    if not own and (warmup_steps or cosine_min_ratio):
        where = "lr_scheduler_kwargs={'warmup_steps': ...}" if lr_scheduler == "lambda_cosine" else "its own kwargs"
        raise ValueError(f"warmup_steps and cosine_min_ratio shape lr_scheduler=None or 'cosine', not "
                         f"{lr_scheduler!r}, which would ignore them; give its warm-up in {where}")
    if cosine_min_ratio and lr_scheduler is None:
        raise ValueError(f"cosine_min_ratio={cosine_min_ratio!r} is the cosine schedule's floor; "
                         "pass lr_scheduler='cosine' too")


GYM_LAMBDA_COSINE: dict[str, Any] = {"warmup_steps": 1, "cosine_anneal": False, "max_steps": None}


def gym_lambda_cosine(kwargs: dict[str, Any], max_steps: int) -> Callable[[int], float]:
    """The seed gym's ``lambda_cosine`` factor, as it computes it: linear warm-up from 0 over ``warmup_steps``
    (default 1), then constant, or with ``cosine_anneal`` a cosine down to 0.1 at ``max_steps`` (the fit's, or
    the smaller given)."""
    warmup = kwargs.get("warmup_steps", GYM_LAMBDA_COSINE["warmup_steps"])
    cosine = kwargs.get("cosine_anneal", GYM_LAMBDA_COSINE["cosine_anneal"])
    end = min(kwargs["max_steps"], max_steps) if kwargs.get("max_steps") is not None else max_steps

    def factor(step: int) -> float:
        if step < warmup:
            return step / max(warmup, 1)
        if not cosine:
            return 1.0
        progress = (step - warmup) / max(1, end - warmup)
        return 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)) + 0.1

    return factor


def flatten(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """One contiguous 1-D buffer holding every tensor (one collective instead of one per tensor).

    An estimate's tensors are on the meta device, where ``torch.cat`` runs its Python reference (about 150 µs a
    call, most of a 1,024-node estimate's strategy run): there only the shape and dtype exist, so it makes them,
    unless autograd would record the cat (then torch.cat, whose result requires grad).
    """
    parts = [t.reshape(-1) for t in tensors]
    recorded = torch.is_grad_enabled() and any(p.requires_grad for p in parts)
    if parts and not recorded and all(p.is_meta and p.dtype == parts[0].dtype for p in parts):
        return torch.empty(sum(p.numel() for p in parts), dtype=parts[0].dtype, device="meta")
    return torch.cat(parts)


def unflatten_into(flat: torch.Tensor, tensors: Iterable[torch.Tensor]) -> None:
    """Copy a buffer made by ``flatten`` back into the tensors, in place."""
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n
