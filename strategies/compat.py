"""The older gym's keyword arguments, accepted by every strategy's constructor (exo-explore/gym).

The gym's ``Strategy`` took ``**kwargs`` and stored them, so a script could pass one set of
arguments to every strategy (``H=20, p=0.05``) and each used what it knew and silently dropped
the rest: its SPARTA ignored ``p`` and ran at ``p_sparta=0.005``. exonet accepts such an argument
(one some strategy takes) with a warning that says it is ignored and what the gym did instead, calls
one that no strategy takes an error, maps the gym's aliases
(``inner_optim_spec=``, DeMo's ``optim_spec=``), and keeps a real misspelling an error with a
"did you mean": ``h=20`` for ``H``, or ``max_step`` (``fit``'s ``max_steps``).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import warnings
from typing import Any, Callable

# Every argument name of every Strategy subclass defined so far (filled by ``accept_gym_spellings``).
KNOWN: dict[str, set[str]] = {}
FIT_ARGUMENTS = ("max_steps", "num_epochs", "batch_size", "minibatch_size", "num_nodes", "val_interval", "val_size",
                 "device", "devices", "seed", "shuffle", "autocast", "run_name", "save_dir", "run_dir", "scenario",
                 "max_sim_time_s")
# What the gym did with an argument that exonet's strategy of that kind takes under another name.
GYM_MEANT = {"p": "p_sparta"}


def _did_you_mean(name: str, choices: set[str]) -> str | None:
    same_case = [c for c in choices if c.lower() == name.lower()]
    if same_case:
        return same_case[0]
    close = difflib.get_close_matches(name, sorted(choices), n=1, cutoff=0.75)
    return close[0] if close else None


def _gym_optim_spec_for_demo(cls_name: str, names: set[str], kwargs: dict[str, Any],
                             coerce: Callable[..., Any]) -> None:
    """DeMo's ``optim_spec=`` (the gym's): DeMo's update is its own sign-SGD, so take the spec's lr and weight decay.

    ``coerce`` is ``OptimSpec.coerce``, handed in by the strategies' base (which this module sits below).
    """
    spec = kwargs.pop("optim_spec")
    if spec is None:
        return
    spec = coerce(spec, "optim_spec", None)
    taken = {k: v for k, v in spec.kwargs.items() if k in ("lr", "weight_decay") and k in names and k not in kwargs}
    kwargs.update(taken)
    dropped = sorted(set(spec.kwargs) - set(taken))
    if spec.cls.__name__ != "SGD" or dropped:
        given = [k for k in dropped if k in kwargs]  # passed to DeMo itself: those win
        unused = [k for k in dropped if k not in kwargs]
        text = (f"{cls_name}: optim_spec gives DeMo its {', '.join(sorted(taken)) or 'nothing'}; DeMo steps with its "
                f"own sign-SGD, so {spec.cls.__name__} is not used{', nor its ' + ', '.join(unused) if unused else ''}")
        if given:
            wins = "wins" if len(given) == 1 else "win"
            text += f"; the {', '.join(given)} passed to {cls_name} {wins} over the spec's"
        warnings.warn(text, stacklevel=4)


def translate(cls_name: str, names: set[str], kwargs: dict[str, Any], coerce: Callable[..., Any]) -> dict[str, Any]:
    """``kwargs`` for a constructor taking ``names``: gym aliases mapped, gym-only arguments dropped with a warning.

    Raises:
        TypeError: an argument that looks like a misspelling of this strategy's or ``fit``'s, with "did you mean".
    """
    kwargs = dict(kwargs)
    if "inner_optim_spec" in kwargs and "inner_optim_spec" not in names and "inner_optim" in names:
        if kwargs.get("inner_optim") is not None:
            raise TypeError("inner_optim and inner_optim_spec are aliases of one argument; pass only one of them")
        kwargs["inner_optim"] = kwargs.pop("inner_optim_spec")
    if "optim_spec" in kwargs and "optim_spec" not in names and "lr" in names:
        _gym_optim_spec_for_demo(cls_name, names, kwargs, coerce)
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


def accept_gym_spellings(cls: type, coerce: Callable[..., Any]) -> None:
    """Wrap ``cls.__init__`` (when it defines one without ``**kwargs``) so that it accepts the gym's spellings.

    ``coerce`` turns an optimizer spelling into an OptimSpec (``OptimSpec.coerce``).

    Only the constructor a user calls translates; the ``super().__init__`` calls inside pass through.
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
        if type(self).__init__ is wrapped and not set(kwargs) <= names:
            kwargs = translate(cls.__name__, names, kwargs, coerce)
        init(self, *args, **kwargs)

    cls.__init__ = wrapped  # type: ignore[misc]
