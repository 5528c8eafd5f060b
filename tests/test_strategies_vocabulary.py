"""One vocabulary (issue 32): ``optim_spec`` first, keyword-only hyperparameters, ``outer_optim_spec`` for the outer
optimizer; exonet's older spellings warn ``DeprecationWarning`` for one release; the gym's spellings stay silent."""

import inspect
import re
import warnings
from pathlib import Path

import pytest
import torch

from exonet.strategies import (
    STRATEGIES,
    AsyncDiLoCoStrategy,
    DDPStrategy,
    DecoupledDiLoCoStrategy,
    DeMoStrategy,
    DiLoCoStrategy,
    FedAvgStrategy,
    FedBuffStrategy,
    MuLoCoStrategy,
    OptimSpec,
    SPARTADiLoCoStrategy,
    SPARTAStrategy,
    StreamingDiLoCoStrategy,
)
from exonet.strategies.base import BASE_OPTIONS

ADAMW = OptimSpec("adamw", lr=3e-4)
OUTER = OptimSpec("sgd", lr=0.5)
WITH_OUTER = (DiLoCoStrategy, SPARTADiLoCoStrategy, StreamingDiLoCoStrategy, AsyncDiLoCoStrategy, FedBuffStrategy,
              DecoupledDiLoCoStrategy, MuLoCoStrategy)


def _parameters(cls):
    return [p for name, p in inspect.signature(cls.__init__).parameters.items() if name != "self"]


@pytest.mark.parametrize("cls", sorted(set(STRATEGIES.values()), key=lambda c: c.__name__))
def test_the_optimizer_comes_first_and_every_hyperparameter_is_keyword_only(cls):
    first, *rest = _parameters(cls)
    assert (first.name, first.kind) == ("optim_spec", first.POSITIONAL_OR_KEYWORD), first
    assert [p.name for p in rest if p.kind is not p.KEYWORD_ONLY] == []
    assert ("outer_optim_spec" in {p.name for p in rest}) == (cls in WITH_OUTER)


@pytest.mark.parametrize("make, meant", [
    (lambda: SPARTAStrategy(ADAMW, 0.01, 2), "p_sparta=0.01, max_norm=2"),
    (lambda: FedAvgStrategy("sgd", 2, 5), "island_size=2, H=5"),
    (lambda: DiLoCoStrategy(ADAMW, OUTER, 50), "H=50"),
    (lambda: DDPStrategy(ADAMW, 1.0), "max_norm=1.0"),
    (lambda: DeMoStrategy(0.01), "optim_spec=OptimSpec('sgd', lr=0.01)"),
    (lambda: FedBuffStrategy(ADAMW, 10, 4, 0.5), "H=10, buffer_size=4, outer_optim_spec=OptimSpec('sgd', lr=0.5)"),
])
def test_a_positional_hyperparameter_is_a_type_error_naming_the_keyword_it_was(make, meant):
    with pytest.raises(TypeError, match=r"keyword-only\. The old order read .* as " + re.escape(meant)):
        make()


@pytest.mark.parametrize("make, new, check", [
    (lambda: DiLoCoStrategy(inner_optim=ADAMW), "optim_spec=", lambda s: s.optim_spec is ADAMW),
    (lambda: DDPStrategy(inner_optim=ADAMW), "optim_spec=", lambda s: s.optim_spec is ADAMW),
    (lambda: AsyncDiLoCoStrategy(outer_optim=OUTER, delayed_nesterov=None), "outer_optim_spec=",
     lambda s: s.outer_optim_spec is OUTER),
    (lambda: StreamingDiLoCoStrategy(ADAMW, OUTER), "pass outer_optim_spec=",
     lambda s: (s.optim_spec, s.outer_optim_spec) == (ADAMW, OUTER)),
    (lambda: FedBuffStrategy(server_lr=0.5), r"outer_optim_spec=OptimSpec\('sgd', lr=0.5\)",
     lambda s: (s.outer_optim_spec.cls, s.outer_optim_spec.kwargs) == (torch.optim.SGD, {"lr": 0.5})),
    (lambda: DeMoStrategy(lr=0.01, weight_decay=0.1), r"optim_spec=OptimSpec\('sgd', lr=0.01\)",
     lambda s: (s.lr, s.weight_decay) == (0.01, 0.1)),
])
def test_old_spellings_work_with_a_deprecation_warning_naming_the_new_one(make, new, check):
    with pytest.warns(DeprecationWarning, match="deprecated and goes in the next release; .*" + new) as caught:
        strategy = make()
    assert check(strategy)
    assert {Path(w.filename).name for w in caught} == {Path(__file__).name}  # points at the caller's line


def test_an_old_and_a_new_spelling_together_are_a_type_error():
    with pytest.raises(TypeError, match="outer_optim is the deprecated spelling of outer_optim_spec; pass only"):
        DiLoCoStrategy(outer_optim=OUTER, outer_optim_spec=OUTER)
    with pytest.raises(TypeError, match="outer_optim_spec given twice"):
        DiLoCoStrategy(ADAMW, OUTER, outer_optim_spec=OUTER)


def test_the_new_and_the_gym_spellings_are_silent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DiLoCoStrategy(ADAMW, outer_optim_spec=OUTER, H=5, max_norm=1.0)
        SPARTADiLoCoStrategy(inner_optim_spec=ADAMW, outer_optim_spec=OUTER)  # the gym's SPARTA-DiLoCo
        FedAvgStrategy(inner_optim_spec=ADAMW, H=2)
        DeMoStrategy(optim_spec=OptimSpec("sgd", lr=0.01, weight_decay=0.1), compression_topk=4)
        FedBuffStrategy(ADAMW, outer_optim_spec=OUTER, buffer_size=3)


def _readme_signatures():
    """``Name(arg=default, ...)`` in strategies/README.md's table, as {class name: {argument: default text}}."""
    text = (Path(__file__).parents[1] / "strategies" / "README.md").read_text()
    text = text.split("## The strategies in detail")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `(\w+Strategy)\(([^`]*)\)`", text, re.M)
    return {name: dict(a.split("=", 1) if "=" in a else (a, None) for a in args.replace("*, ", "").split(", "))
            for name, args in rows}


def test_the_readme_table_gives_each_strategy_its_signature_from_the_code():
    table = _readme_signatures()
    assert set(table) == {cls.__name__ for cls in STRATEGIES.values()}
    for cls in set(STRATEGIES.values()):
        code = {p.name: p.default for p in _parameters(cls) if p.name not in BASE_OPTIONS}
        assert list(table[cls.__name__]) == list(code), cls.__name__
        for name, default in table[cls.__name__].items():
            if default is not None:
                assert eval(default) == code[name], (cls.__name__, name)


def test_a_subclass_passing_an_old_spelling_to_super_warns_at_its_own_line():
    class Mine(DiLoCoStrategy):
        def __init__(self, inner):
            super().__init__(inner_optim=inner, H=7)

    with pytest.warns(DeprecationWarning, match="inner_optim= is deprecated.*pass optim_spec=") as caught:
        mine = Mine(ADAMW)
    assert (mine.optim_spec, mine.H) == (ADAMW, 7)
    assert {Path(w.filename).name for w in caught} == {Path(__file__).name}


@pytest.mark.parametrize("cls", sorted(set(STRATEGIES.values()), key=lambda c: c.__name__))
def test_the_base_options_are_one_dataclass_appended_to_each_signature(cls):
    assert not set(BASE_OPTIONS) & set(inspect.signature(inspect.unwrap(cls.__init__)).parameters)  # not repeated
    assert [p.name for p in _parameters(cls)][-len(BASE_OPTIONS):] == list(BASE_OPTIONS)
    strategy = cls(max_norm=0.5, lr_scheduler="cosine", warmup_steps=3, cosine_min_ratio=0.1)
    assert (strategy.max_norm, strategy.lr_scheduler, strategy.warmup_steps, strategy.cosine_min_ratio) == (
        0.5, "cosine", 3, 0.1)
    with pytest.raises(ValueError, match="max_norm"):
        cls(max_norm=0)
