"""Fuzzing what a resume reads back: node files, latest.json and config.json of a checkpointed run.

The strategies and the check are ``exonet.bench._fuzz_checkpoints`` (read there what must hold). Here they
run a 500-example round from the suite's fixed seed (tests/conftest.py prints it); ``python -m exonet.bench
fuzz --only checkpoints`` runs the 10,000-example random search. Each damage that ever failed is an
``@example`` below.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Iterator

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings

from exonet.bench._fuzz_checkpoints import PROPERTIES, Damage, base_run, check, resume_reads, set_in_node
from exonet.bench.fuzz import counts

ROUND = counts(PROPERTIES, 500)  # 200 node states, 150 node bytes, 100 latest.json, 40 config.json, 10 file moves
SLOW_INPUTS = [HealthCheck.too_slow, HealthCheck.data_too_large]


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    """One scratch folder per module: its base run is written once, and each example damages a copy."""
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def test_the_base_run_resumes(folder):
    resume_reads(base_run(folder))


# 1d59667: a node file whose format was a tensor raised "Boolean value of Tensor ... is ambiguous".
@example(set_in_node(0, ("format",), torch.zeros(3)))
@settings(max_examples=ROUND["node state"], suppress_health_check=SLOW_INPUTS)
@given(PROPERTIES["node state"].strategy)
def test_a_node_file_with_values_changed_resumes_or_names_it(folder, damaged: Damage) -> None:
    check(damaged, folder)


@settings(max_examples=ROUND["node bytes"], suppress_health_check=SLOW_INPUTS)
@given(PROPERTIES["node bytes"].strategy)
def test_a_node_file_with_bytes_damaged_resumes_or_names_it(folder, damaged: Damage) -> None:
    check(damaged, folder)


@settings(max_examples=ROUND["latest.json"], suppress_health_check=SLOW_INPUTS)
@given(PROPERTIES["latest.json"].strategy)
def test_a_damaged_latest_json_resumes_or_is_named(folder, damaged: Damage) -> None:
    check(damaged, folder)


@settings(max_examples=ROUND["config.json"], suppress_health_check=SLOW_INPUTS)
@given(PROPERTIES["config.json"].strategy)
def test_a_damaged_config_json_resumes_or_is_named(folder, damaged: Damage) -> None:
    check(damaged, folder)


@settings(max_examples=ROUND["files"], suppress_health_check=SLOW_INPUTS)
@given(PROPERTIES["files"].strategy)
def test_node_files_swapped_copied_or_removed_resume_or_are_named(folder, damaged: Damage) -> None:
    check(damaged, folder)
