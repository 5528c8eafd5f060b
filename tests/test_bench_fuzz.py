"""``python -m exonet.bench fuzz``: the random search that left the test suite, run small."""

from __future__ import annotations

import sys

from exonet.bench import fuzz
from exonet.bench.__main__ import exit_status

PROPERTIES = ["trace mutations", "trace events", "scenario", "node state", "node bytes", "latest.json", "config.json",
              "files"]


def test_the_fuzz_bench_prints_its_seed_and_runs_every_property(capsys):
    figures = fuzz.main(["--examples", "40"])
    out = capsys.readouterr().out
    assert isinstance(figures, dict) and exit_status(figures) == 0 and figures["failed"] == []
    seed = figures["seed"]
    assert out.startswith(f"fuzz seed {seed} (python -m exonet.bench fuzz --seed {seed} repeats this search)")
    assert list(figures["examples"]) == PROPERTIES
    assert all(figures["examples"][name] >= n for name, n in fuzz.counts(fuzz.family("formats"), 40).items())


def test_a_seed_repeats_the_search_and_only_picks_a_family_or_a_property(capsys):
    figures = fuzz.main(["--examples", "20", "--seed", "7", "--only", "checkpoints", "--only", "scenario"])
    assert isinstance(figures, dict) and figures["seed"] == 7
    assert list(figures["examples"]) == ["scenario", "node state", "node bytes", "latest.json", "config.json", "files"]
    assert fuzz.main(["--only", "nope"]) == 2
    assert "--only ['nope']: no such family or property" in capsys.readouterr().err


def test_a_failure_names_the_property_and_the_command_that_repeats_it(capsys, monkeypatch):
    def refuses_latency(data: bytes, folder) -> None:
        assert b"latency" not in data

    scenario = fuzz.family("formats")["scenario"]
    monkeypatch.setitem(fuzz.family("formats"), "scenario", fuzz.Property(scenario.strategy, refuses_latency, 0.3))
    figures = fuzz.main(["--examples", "100", "--seed", "3", "--only", "scenario"])
    assert isinstance(figures, dict) and exit_status(figures) == 1 and figures["failed"] == ["scenario"]
    out, err = capsys.readouterr()
    assert "falsifying input: b'" in err and "latency" in err  # the traceback, with the shrunk input
    assert "FAILED scenario: python -m exonet.bench fuzz --seed 3 --only 'scenario' --examples 100" in out


def test_without_hypothesis_the_bench_says_it_is_a_dev_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "hypothesis", None)  # import hypothesis raises ImportError
    assert fuzz.main(["--examples", "10"]) == 2
    assert 'needs Hypothesis, a dev extra: pip install -e ".[dev]"' in capsys.readouterr().err
