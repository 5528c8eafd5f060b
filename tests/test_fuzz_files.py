"""Fuzzing the two file formats users hand to exonet: traces (JSON lines) and scenarios (TOML).

The strategies and checks are ``exonet.bench._fuzz_files`` (read there what must hold). Here they run a
500-example round from the suite's fixed seed (tests/conftest.py prints it), so the gate passes or fails on
the code alone; ``python -m exonet.bench fuzz`` runs the 10,000-example random search. Each input that ever
failed is an ``@example`` below, replayed first on every run.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings

from exonet.bench._fuzz_files import PROPERTIES, check_scenario_file, check_trace_file
from exonet.bench.fuzz import counts

ROUND = counts(PROPERTIES, 500)  # 200 trace mutations, 150 trace files built field by field, 150 scenarios
SLOW_INPUTS = [HealthCheck.too_slow, HealthCheck.data_too_large]
HEADER = '{"format": "exonet-trace", "version": 1, "num_nodes": 1, "meta": {}}\n'


def in_a_folder(check, data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        check(data, Path(d))


@settings(max_examples=ROUND["trace mutations"], suppress_health_check=SLOW_INPUTS)
@given(PROPERTIES["trace mutations"].strategy)
def test_a_mutated_trace_file_loads_or_its_error_names_the_file(data: bytes) -> None:
    in_a_folder(check_trace_file, data)


# Bounds added as the fuzz round was written (9ea6959): a compute span whose sum overflows the replay, a
# payload past int64.
@example((HEADER + '["c", 0, 1e300, 0.5, 0]\n["s", 0]\n{"end": true, "events": 2}\n').encode())
@example((HEADER + '["x", 0, 0, "all_reduce", 9223372036854775808, null, 0, "float32", null, null]\n'
          '{"end": true, "events": 1}\n').encode())
@settings(max_examples=ROUND["trace events"], suppress_health_check=SLOW_INPUTS)
@given(PROPERTIES["trace events"].strategy)
def test_a_trace_file_built_field_by_field_loads_or_its_error_names_the_file(data: bytes) -> None:
    in_a_folder(check_trace_file, data)


# Issue 43: a clean-clone CI drew efficiency = 1.1e-308, which passed the schema and made simulate raise
# OverflowError (a rate of ~1e-300 bytes/s turned into an infinite tick count).
@example(b'name = "s"\n[network]\nbandwidth = "1 Gbit/s"\nefficiency = 1.1e-308\n')
# 5180d7f: malformed TOML must name its line.
@example(b'name = "s"\n[network]\nbandwidth = "1 Gbit/s"\nlatency = \n')
@settings(max_examples=ROUND["scenario"], suppress_health_check=SLOW_INPUTS)
@given(PROPERTIES["scenario"].strategy)
def test_a_scenario_file_loads_and_replays_or_its_error_names_the_file(data: bytes) -> None:
    in_a_folder(check_scenario_file, data)
