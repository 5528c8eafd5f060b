"""A new random search of exonet's file readers: ``python -m exonet.bench fuzz [--examples N] [--seed S]``.

The test suite runs these properties with one fixed seed (500 examples a family, tests/test_fuzz_*.py), so
CI passes or fails on the code alone; a search that may find a new input belongs here, where finding one
is the point. Each run draws a fresh seed and prints it first; ``--seed S`` repeats that search exactly.
A failure prints Hypothesis's falsifying example: add it to the matching test as an ``@example``.

Families (``--only`` takes a family or a property name):

- ``formats``: trace files (mutations of valid ones, events built field by field) and scenario files
  (``exonet.bench._fuzz_files``).
- ``checkpoints``: damaged run directories read back by a resume (``exonet.bench._fuzz_checkpoints``).

Hypothesis is a dev extra (``pip install -e ".[dev]"``); without it the benchmark says so and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import random
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

EXAMPLES = 10_000  # per family, as the rounds that ran in CI before they moved here
DEADLINE = timedelta(seconds=5)  # per example: a slow or hung reader fails the search (not the test suite)
FAMILIES = {"formats": "exonet.bench._fuzz_files", "checkpoints": "exonet.bench._fuzz_checkpoints"}


@dataclass(frozen=True)
class Property:
    """Inputs to draw and what must hold for each: ``check(value, folder)`` raises on a violation.

    ``folder`` is one scratch directory for the whole run; ``share`` is the property's part of its family's
    examples.
    """

    strategy: SearchStrategy[Any]
    check: Callable[[Any, Path], None]
    share: float


def counts(properties: dict[str, Property], total: int) -> dict[str, int]:
    """``total`` examples split by the properties' shares (at least one each)."""
    return {name: max(1, round(total * p.share)) for name, p in properties.items()}


def family(name: str) -> dict[str, Property]:
    """The properties of one family (imports Hypothesis)."""
    return importlib.import_module(FAMILIES[name]).PROPERTIES


class PropertyFailed(Exception):
    """A property's check failed; ``value`` is the input it failed on last, Hypothesis's shrunk example (its own
    report of it is worded differently from one Hypothesis release to the next)."""

    def __init__(self, value: Any) -> None:
        super().__init__(f"falsifying input: {value!r}")
        self.value = value


def run_property(prop: Property, examples: int, seed: int) -> int:
    """Draw ``examples`` inputs from ``seed`` (no examples database: the seed is the record) and check each;
    returns how many ran. Raises PropertyFailed, from what the check raised, for the shrunk falsifying example."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as fixed_seed

    ran = 0
    failing: list[Any] = []
    with tempfile.TemporaryDirectory() as d:
        @settings(max_examples=examples, deadline=DEADLINE, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
        @fixed_seed(seed)
        @given(prop.strategy)
        def run(value: Any) -> None:
            nonlocal ran
            ran += 1
            try:
                prop.check(value, Path(d))
            except Exception:
                failing[:] = [value]  # the last to fail is the shrunk example, which Hypothesis replays last
                raise

        try:
            run()
        except Exception as err:
            if not failing:
                raise
            raise PropertyFailed(failing[0]) from err
    return ran


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m exonet.bench fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=EXAMPLES, help=f"per family (default {EXAMPLES:,})")
    parser.add_argument("--seed", type=int, default=None, help="repeat a search (default: a new random seed)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help=f"a family ({', '.join(FAMILIES)}) or one property; may be repeated")
    args = parser.parse_args(argv)
    if args.examples < 1:
        parser.error("--examples must be at least 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any] | int:
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    try:
        import hypothesis  # noqa: F401 - only to say clearly that it is missing
    except ImportError:
        print("python -m exonet.bench fuzz needs Hypothesis, a dev extra: pip install -e \".[dev]\" "
              "(or pip install hypothesis)", file=sys.stderr)
        return 2
    seed = random.randrange(2**32) if args.seed is None else args.seed
    chosen = {(fam, name): p for fam in FAMILIES for name, p in family(fam).items()
              if not args.only or fam in args.only or name in args.only}
    if not chosen:
        print(f"--only {args.only}: no such family or property", file=sys.stderr)
        return 2
    print(f"fuzz seed {seed} (python -m exonet.bench fuzz --seed {seed} repeats this search)", flush=True)
    figures: dict[str, Any] = {"seed": seed, "examples": {}, "seconds": {}, "failed": []}
    for fam in FAMILIES:
        props = {name: p for (f, name), p in chosen.items() if f == fam}
        for name, n in counts(props, args.examples).items():
            start = time.perf_counter()
            try:
                figures["examples"][name] = run_property(props[name], n, seed)
            except Exception:  # noqa: BLE001 - reported with the way to repeat it; the other properties still run
                traceback.print_exc()
                figures["failed"].append(name)
                print(f"FAILED {name}: python -m exonet.bench fuzz --seed {seed} --only '{name}' --examples "
                      f"{args.examples}", flush=True)
                continue
            figures["seconds"][name] = time.perf_counter() - start
            print(f"{name}: {figures['examples'][name]:,} examples in {figures['seconds'][name]:.1f} s", flush=True)
    figures["ok"] = not figures["failed"]
    return figures
