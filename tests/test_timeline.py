"""``exonet timeline``: the Gantt chart of a replay and its text picture, from a run directory."""

from __future__ import annotations

import pytest

from exonet import Trace
from exonet.cli import main as cli
from exonet.netsim import simulate
from exonet.scenario import LinkSpec, Resolved
from exonet.study.timeline import text

B = 1.0e9


def overlapped(n: int = 4, steps: int = 3) -> Trace:
    """Per step: 0.1 s forward, an async all-reduce of 20 MB under 0.2 s of backward, a wait."""
    t = Trace(n)
    for r in range(n):
        for _ in range(steps):
            t.add_compute(r, 0.1)
            cid = t.add_collective(r, "all_reduce", 20_000_000, async_op=True)
            t.add_compute(r, 0.2)
            t.add_wait(r, cid)
            t.add_step(r)
    return t


def two_regions(n: int = 4) -> Resolved:
    return Resolved(num_nodes=n, uplink=(B,) * n, downlink=(B,) * n, region=("us",) * 2 + ("eu",) * (n - 2),
                    latency=1e-3, links={("eu", "us"): LinkSpec(bandwidth=B / 10, latency=0.02)}, speed=(1.0,) * n,
                    algorithms={}, name="two")


def test_the_text_picture_shows_each_kind_where_it_happened_and_the_busiest_link():
    result = simulate(overlapped(), two_regions())
    lines = text(result, width=40, links=2).splitlines()
    nodes = [line for line in lines if line.startswith("node ")]
    assert len(nodes) == 4
    bar = nodes[0].split()[2]
    assert len(bar) == 40 and set(bar) <= set("#=.")
    assert bar[0] == "#" and "=" in bar  # it starts computing; the all-reduce outlasts the backward
    node = result.per_node[0]
    assert f"compute {node.compute_s / result.wall_clock_s:4.0%}" in nodes[0]
    asyncs = [line for line in lines if line.startswith("  async ")]
    assert len(asyncs) == 4 and all("~" in line for line in asyncs)
    links = [line for line in lines if "utilization" in line and not line.startswith("node")]
    top = result.busiest_links(1)[0]
    assert top.name in ("us->eu", "eu->us") and links[0].startswith(top.name)
    assert f"utilization {top.utilization:4.0%}" in links[0]


def test_cli_timeline_on_a_run_directory_writes_the_image_and_prints_the_text(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run.jsonl"
    overlapped().save(run)
    out = tmp_path / "timeline.png"
    assert cli(["timeline", str(run), "--scenario", "cross-region", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "timeline: scenario cross-region, 4 nodes, 3 steps" in printed
    assert printed.count("\nnode ") == 4 and ("us-east->eu-west " in printed or "eu-west->us-east " in printed)


@pytest.mark.slow
def test_cli_timeline_on_the_folder_given_to_fit(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from exonet import LocalTrainer
    from exonet.strategies import DDPStrategy, OptimSpec
    from exonet.toy import synthetic_classification, tiny_mlp

    runs = tmp_path / "runs"
    LocalTrainer(tiny_mlp(), synthetic_classification(64, dim=8, classes=4)).fit(
        DDPStrategy(OptimSpec("sgd", lr=0.1)), num_nodes=2, max_steps=3, batch_size=8, val_size=0, progress=False,
        device="cpu", run_dir=runs)
    out = tmp_path / "timeline.png"
    assert cli(["timeline", str(runs), "--scenario", "datacenter", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert "timeline: scenario datacenter, 2 nodes, 3 steps" in printed and printed.count("\nnode ") == 2


def test_cli_simulate_checks_every_scenario_before_printing_any_result(tmp_path, capsys):
    """A second --scenario that cannot hold the run failed only after the first one's whole result was
    printed; now nothing is printed but the error. A chrome trace goes into a folder made on the way."""
    run = tmp_path / "run.jsonl"
    overlapped().save(run)
    hosts3 = tmp_path / "hosts3.toml"
    hosts3.write_text('name = "h3"\n[network]\nbandwidth = "1 Gbit/s"\n[hosts]\ndevices = 3\nbandwidth = "450 GB/s"\n')
    assert cli(["simulate", str(run), "--scenario", "datacenter", "--scenario", str(hosts3)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "hosts.devices = 3 does not divide num_nodes=4" in err
    chrome = tmp_path / "new" / "run.json"
    assert cli(["simulate", str(run), "--scenario", "datacenter", "--chrome-trace", str(chrome)]) == 0
    assert chrome.stat().st_size > 0 and "caution: compute timed by the trace's wall seconds" in capsys.readouterr().out


@pytest.mark.parametrize("flag, argv", [
    ("--chrome-trace", ["simulate", "{run}", "--scenario", "datacenter", "--chrome-trace", "{out}"]),
    ("--out", ["timeline", "{run}", "--scenario", "datacenter", "--out", "{out}"]),
    ("--plot", ["compare", "{run}", "--scenario", "datacenter", "--plot", "{out}"]),
    ("--save", ["validate", "--measurements", "{run}", "--save", "{out}"]),
])
def test_an_output_path_that_cannot_be_written_is_named_before_the_replay(tmp_path, capsys, flag, argv):
    """A file where the output's folder must be was a FileExistsError traceback after the whole replay."""
    run = tmp_path / "run.jsonl"
    overlapped().save(run)
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "x.png"
    assert cli([a.format(run=run, out=out) for a in argv]) == 2
    printed, err = capsys.readouterr()
    assert printed == ""  # nothing replayed or measured first
    assert f"error: {flag}: cannot write {out}: {tmp_path / 'afile'} is a file, not a folder" in err
    assert cli(["simulate", str(run), "--scenario", "datacenter", "--chrome-trace", str(tmp_path)]) == 2
    assert f"error: --chrome-trace: {tmp_path} is a folder; give a file path" in capsys.readouterr().err
    assert cli(["quickstart", "--out", str(run)]) == 2
    assert f"error: --out: {run} is a file; give a folder path" in capsys.readouterr().err
