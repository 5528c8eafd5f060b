"""The older spellings every strategy's constructor accepts: the gym's (exo-explore/gym) and exonet's own.

The gym's ``Strategy`` took ``**kwargs`` and stored them, so a script could pass one set of
arguments to every strategy (``H=20, p=0.05``) and each used what it knew and silently dropped
the rest: its SPARTA ignored ``p`` and ran at ``p_sparta=0.005``. exonet accepts such an argument
(one some strategy takes) with a warning that says it is ignored and what the gym did instead, calls
one that no strategy takes an error, maps the gym's alias ``inner_optim_spec=`` silently, and keeps a
real misspelling an error with a "did you mean": ``h=20`` for ``H``, or ``max_step`` (``fit``'s ``max_steps``).

exonet's own spellings before one vocabulary (``optim_spec``, ``outer_optim_spec``, keyword-only
hyperparameters) keep working for one release with a ``DeprecationWarning`` naming the new one:
``inner_optim=``, ``outer_optim=``, FedBuff's ``server_lr=``, DeMo's ``lr=``, and an optimizer
passed in the old second position. A positional hyperparameter is a ``TypeError`` that names the
keyword the old order gave it: mapping it would keep the surprise the keyword-only order removes
(``SPARTAStrategy(spec, 0.01, 2)`` meant ``max_norm=2``).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import numbers
import warnings
from typing import Any, Callable

# Every argument name of every Strategy subclass defined so far (filled by ``accept_gym_spellings``).
KNOWN: dict[str, set[str]] = {}
FIT_ARGUMENTS = ("max_steps", "num_epochs", "batch_size", "minibatch_size", "num_nodes", "val_interval", "val_size",
                 "device", "devices", "seed", "shuffle", "autocast", "run_name", "save_dir", "run_dir", "scenario",
                 "max_sim_time_s")
# What the gym did with an argument that exonet's strategy of that kind takes under another name.
GYM_MEANT = {"p": "p_sparta"}
# Deprecated (one release): each strategy's positional order before the hyperparameters became keyword-only,
# and the optimizer keywords renamed to the one vocabulary.
OLD_POSITIONAL = {
    "DDPStrategy": ("optim_spec", "max_norm", "bucket_cap_mb", "overlap"),
    "FedAvgStrategy": ("inner_optim", "island_size", "H", "max_norm"),
    "DiLoCoStrategy": ("inner_optim", "outer_optim", "H", "max_norm"),
    "SPARTAStrategy": ("inner_optim", "p_sparta", "max_norm", "delay_steps"),
    "DeMoStrategy": ("lr", "compression_decay", "compression_topk", "compression_chunk", "weight_decay"),
    "SPARTADiLoCoStrategy": ("inner_optim", "outer_optim", "p_sparta", "sparta_interval", "H", "max_norm"),
    "StreamingDiLoCoStrategy": ("inner_optim", "outer_optim", "H", "num_fragments", "delay_steps", "quantize_bits",
                                "merge_alpha", "max_norm"),
    "AsyncDiLoCoStrategy": ("inner_optim", "outer_optim", "H", "max_norm"),
    "FedBuffStrategy": ("inner_optim", "H", "buffer_size", "server_lr", "max_norm"),
}
RENAMED = {"inner_optim": "optim_spec", "outer_optim": "outer_optim_spec"}
# Deprecated learning rates that are now an SGD spec's lr, and the argument that takes the spec.
LR_RENAMED = {"server_lr": "outer_optim_spec", "lr": "optim_spec"}


def _did_you_mean(name: str, choices: set[str]) -> str | None:
    same_case = [c for c in choices if c.lower() == name.lower()]
    if same_case:
        return same_case[0]
    close = difflib.get_close_matches(name, sorted(choices), n=1, cutoff=0.75)
    return close[0] if close else None


def deprecated(cls_name: str, names: set[str], kwargs: dict[str, Any], spec_type: Any, stacklevel: int = 3) -> None:
    """Map exonet's renamed keywords in ``kwargs`` to the new ones, each with a DeprecationWarning.

    ``stacklevel`` is the warning's: 3 names the line that called the constructor this function was called from."""
    old = OLD_POSITIONAL.get(cls_name, ())
    for name, value in [(n, kwargs[n]) for n in kwargs if n not in names]:
        if name in RENAMED and RENAMED[name] in names:
            new, spec, hint = RENAMED[name], value, f"{RENAMED[name]}="
        elif name in LR_RENAMED and name in old:
            new, spec = LR_RENAMED[name], spec_type("sgd", lr=value)
            hint = f"{new}=OptimSpec('sgd', lr={value!r})"
        else:
            continue
        if kwargs.get(new) is not None:
            raise TypeError(f"{cls_name}: {name} is the deprecated spelling of {new}; pass only {new}")
        warnings.warn(f"{cls_name}: {name}= is deprecated and goes in the next release; pass {hint}",
                      DeprecationWarning, stacklevel=stacklevel)
        del kwargs[name]
        kwargs[new] = spec


def old_positional(cls_name: str, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional arguments in the deprecated order: a second optimizer moves to its keyword (warned); a
    hyperparameter is a TypeError naming the keyword it was.

    The first position is the optimizer (``optim_spec``) unless it is a number where the old order had one
    (DeMo's ``lr``).
    """
    old = OLD_POSITIONAL.get(cls_name)
    if old is None or not args:
        return args, kwargs
    first_is_optimizer = not (isinstance(args[0], numbers.Real) and not isinstance(args[0], bool))
    if first_is_optimizer and len(args) == 1:
        return args, kwargs
    kwargs = dict(kwargs)
    given = list(zip(old, args))[1:] if first_is_optimizer else list(zip(old, args))
    hyper = [(name, value) for name, value in given if name not in RENAMED]
    if hyper:
        as_keywords = ", ".join(f"{LR_RENAMED[name]}=OptimSpec('sgd', lr={value!r})" if name in LR_RENAMED
                                else f"{name}={value!r}" for name, value in hyper)
        raise TypeError(f"{cls_name}: only the optimizer (optim_spec) is positional; its hyperparameters are "
                        f"keyword-only. The old order read {', '.join(repr(v) for _, v in hyper)} as {as_keywords}: "
                        "pass them by name")
    for name, value in given:
        new = RENAMED[name]
        if kwargs.get(new) is not None:
            raise TypeError(f"{cls_name}: {new} given twice: by position and by name")
        warnings.warn(f"{cls_name}: the {name.split('_')[0]} optimizer as a positional argument is deprecated and "
                      f"goes in the next release; pass {new}=", DeprecationWarning, stacklevel=3)
        kwargs[new] = value
    return args[:1] if first_is_optimizer else (), kwargs


def translate(cls_name: str, names: set[str], kwargs: dict[str, Any], spec_type: Any) -> dict[str, Any]:
    """``kwargs`` for a constructor taking ``names``: aliases mapped (deprecated ones warned), gym-only arguments
    dropped with a warning.

    ``spec_type`` is ``OptimSpec``, handed in by the strategies' base (which this module sits below).

    Raises:
        TypeError: an argument that looks like a misspelling of this strategy's or ``fit``'s, with "did you mean".
    """
    kwargs = dict(kwargs)
    if "inner_optim_spec" in kwargs and "inner_optim_spec" not in names and "optim_spec" in names:
        if kwargs.get("optim_spec") is not None:
            raise TypeError("optim_spec and inner_optim_spec (the gym's spelling) are one argument; pass only one")
        kwargs["optim_spec"] = kwargs.pop("inner_optim_spec")
    deprecated(cls_name, names, kwargs, spec_type, stacklevel=4)
    elsewhere = set().union(*KNOWN.values()) if KNOWN else set()
    for name in [n for n in kwargs if n not in names]:
        if name not in elsewhere and name not in GYM_MEANT:
            own = _did_you_mean(name, names - {"self"})
            if own is not None:
                raise TypeError(f"{cls_name}: unexpected argument {name!r}; did you mean {own!r}?")
            fits = _did_you_mean(name, set(FIT_ARGUMENTS))
            if fits is not None:
                raise TypeError(f"{cls_name}: unexpected argument {name!r}; did you mean fit's {fits!r}? "
                                f"(pass it to LocalTrainer.fit, not to the strategy)")
            raise TypeError(f"{cls_name}: unexpected argument {name!r}: no strategy takes it; "
                            f"valid: {', '.join(sorted(names - {'self'}))}")
        value = kwargs.pop(name)
        meant = GYM_MEANT.get(name)
        if meant in names:
            default = inspect.signature(_KNOWN_INITS[cls_name]).parameters[meant].default
            what = (f"the gym ignored it silently, so its {cls_name} ran at {meant}={default!r}; "
                    f"pass {meant}={value!r} if that is what you meant")
        else:
            users = sorted(c for c, args in KNOWN.items() if name in args and c != cls_name)
            where = f" (an argument of {', '.join(users)})" if users else ""
            what = (f"it is not one of its arguments{where}; a gym script passes one argument list to every "
                    "strategy, and the gym's strategies dropped what they did not take, as this one does")
        warnings.warn(f"{cls_name}: {name}={value!r} is ignored: {what}", stacklevel=3)
    return kwargs


_KNOWN_INITS: dict[str, Callable[..., None]] = {}


def accept_gym_spellings(cls: type, spec_type: Any) -> None:
    """Wrap ``cls.__init__`` (when it defines one without ``**kwargs``) so that it accepts the older spellings.

    ``spec_type`` is ``OptimSpec`` (an optimizer spelling becomes one; a deprecated lr becomes an SGD spec).

    Only the constructor a user calls translates the gym's spellings; exonet's deprecated ones are mapped in a
    subclass's ``super().__init__`` call too.
    """
    init = cls.__dict__.get("__init__")
    if init is None:
        return
    params = inspect.signature(init).parameters
    names = set(params) - {"self"}
    KNOWN[cls.__name__] = names
    _KNOWN_INITS[cls.__name__] = init
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return

    @functools.wraps(init)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> None:
        args, kwargs = old_positional(cls.__name__, args, kwargs)
        if not set(kwargs) <= names:
            if type(self).__init__ is wrapped:
                kwargs = translate(cls.__name__, names, kwargs, spec_type)
            else:
                kwargs = dict(kwargs)
                deprecated(cls.__name__, names, kwargs, spec_type)
        init(self, *args, **kwargs)

    cls.__init__ = wrapped  # type: ignore[misc]
