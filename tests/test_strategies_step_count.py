"""The base class counts ``local_step``: no strategy writes ``self.local_step += 1``.

Each ``step()`` adds one as it returns, wherever it is called from (the node loop, ``estimate``, the
bench). Inside a step the count is the steps done before it; a step that calls ``super().step()`` sees
it go up when that returns, as in the seed gym. A strategy written when strategies counted themselves
keeps its count, with a DeprecationWarning. One node in one process: a gloo group of one.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import exonet.strategies as S
from exonet.communicator import Communicator
from exonet.strategies.base import NodeContext, Strategy
from exonet.toy import tiny_mlp

STEPS = 5
SHIPPED = sorted((cls for cls in vars(S).values()
                  if isinstance(cls, type) and issubclass(cls, Strategy) and cls is not Strategy),
                 key=lambda cls: cls.__name__)


@pytest.fixture(scope="module")
def world_of_one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def run_steps(strategy: Strategy, steps: int = STEPS) -> Strategy:
    model = tiny_mlp()
    strategy.setup(model, Communicator(0, 1, torch.device("cpu")), NodeContext(0, 1, 10, 0, torch.device("cpu")))
    batch = (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 3]))
    for _ in range(steps):
        strategy.zero_grad()
        model(batch).backward()
        strategy.step()
    strategy.finish()
    return strategy


@pytest.mark.parametrize("cls", SHIPPED, ids=lambda cls: cls.__name__)
def test_every_shipped_strategy_is_counted_once_per_step_without_a_warning(cls: type[Strategy], world_of_one: None):
    kwargs = {"num_fragments": 2} if cls is S.DecoupledDiLoCoStrategy else {}  # tiny_mlp has 4 tensors, not 24
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert run_steps(cls(**kwargs)).local_step == STEPS


def test_no_shipped_strategy_or_example_counts_itself():
    root = Path(__file__).resolve().parents[1]
    sources = [*(p for p in (root / "strategies").glob("*.py") if p.name != "base.py"),  # base.py's counter
               *(root / "examples").glob("*.py"), root / "exonet" / "runtime" / "testing.py", root / "README.md"]
    assert [p.name for p in sources if "local_step += 1" in p.read_text()] == []


class Seen(Strategy):
    """Records the count each step sees."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def step(self) -> None:
        self.seen.append(self.local_step)
        self.optimizer_step()


class AfterSuper(Seen):
    def step(self) -> None:
        super().step()
        self.seen.append(self.local_step)


class CountsItself(Strategy):
    def step(self) -> None:
        self.optimizer_step()
        self.local_step += 1


def test_inside_a_step_the_count_is_the_steps_before_it(world_of_one: None):
    assert run_steps(Seen()).seen == [0, 1, 2, 3, 4]


def test_a_super_step_counts_once_and_the_caller_sees_it_counted(world_of_one: None):
    strategy = run_steps(AfterSuper())
    assert strategy.seen == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5]
    assert strategy.local_step == STEPS


def test_a_strategy_that_counts_itself_is_counted_once_with_one_deprecation_warning(world_of_one: None):
    with pytest.warns(DeprecationWarning, match=r"CountsItself\.step counts local_step itself") as caught:
        strategy = run_steps(CountsItself())
        run_steps(CountsItself())
    assert strategy.local_step == STEPS
    assert len([w for w in caught if issubclass(w.category, DeprecationWarning)]) == 1


def test_diloco_syncs_at_every_hth_step_as_before(world_of_one: None, monkeypatch: pytest.MonkeyPatch):
    synced: list[tuple[int, int]] = []
    strategy = S.DiLoCoStrategy(H=2)
    sync_round = strategy.sync_round

    def record() -> None:
        synced.append((strategy.local_step + 1, strategy.rounds_done()))
        sync_round()

    monkeypatch.setattr(strategy, "sync_round", record)
    run_steps(strategy)
    assert synced == [(2, 1), (4, 2)]  # (this step's number, rounds done with it)
