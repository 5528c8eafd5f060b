"""Examples run as a user runs them (subprocesses), and their printed claims hold."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_example(name: str, *args: str, timeout: float = 300) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_custom_int8_strategy_sends_P_plus_4_bytes_and_learns():
    out = run_example("custom_strategy.py", "--steps", "40", "--nodes", "2")
    params = int(re.search(r"parameters: (\d+)", out).group(1))
    rows = {m.group(1): (float(m.group(2)), int(m.group(3).replace(",", "")))
            for m in re.finditer(r"^(int8|fp32) DDP\s+val loss ([\d.]+)\s+payload/step/node ([\d,]+) bytes", out, re.M)}
    assert rows["int8"][1] == params + 4  # int8 codes plus one fp32 scale
    assert rows["fp32"][1] == 4 * params
    assert rows["int8"][0] < 2.0 and abs(rows["int8"][0] - rows["fp32"][0]) < 0.15  # learns (chance: ln 10 = 2.3)


@pytest.mark.slow
def test_parameter_server_example_reduces_and_broadcasts_as_ddp_learns():
    """reduce + broadcast through rank 0 (after a barrier) trains the model DDP trains, with twice its payload;
    through a hub both are the same messages, so the same simulated time, and the server sends n − 1 times what a
    node does. Gathering every gradient instead trains the same model."""
    out = run_example("parameter_server.py", "--steps", "20", "--nodes", "3")
    rows = {(m.group(1), m.group(4)): m.groups() for m in re.finditer(
        r"^\| (parameter server|DDP) \| ([\d.]+) \| ([\d,]+) \| (\w+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", out, re.M)}
    assert len(rows) == 6, out
    ps, ddp = rows["parameter server", "star"], rows["DDP", "star"]
    assert float(ps[1]) < 2.2 and abs(float(ps[1]) - float(ddp[1])) < 1e-3  # learns (chance: ln 10 = 2.3), as DDP
    assert int(ps[2].replace(",", "")) == 2 * int(ddp[2].replace(",", ""))  # a reduce and a broadcast of P floats
    seconds = {"ms": 1e-3, "s": 1.0}
    ps_s, ddp_s = (float(x.split()[0]) * seconds[x.split()[1]] for x in (ps[4], ddp[4]))
    assert ps_s == pytest.approx(ddp_s + 2 * 0.010, abs=1.5e-3)  # through the hub: the same messages, and the
    # barrier's empty round trip to the hub (2 × 10 ms)
    params = int(re.search(r"parameters: (\d+)", out).group(1))
    server, node = (float(x.split()[0]) * {"kB": 1e3, "MB": 1e6}[x.split()[1]] for x in ps[5:7])
    assert server == pytest.approx(2 * 4 * params * 20, rel=5e-3) and node == pytest.approx(4 * params * 20, rel=5e-3)
    assert "node 1's calls: barrier x1, broadcast x20, reduce x20" in out
    # the classic server gathers every gradient and averages it there: the same model, other messages
    gathered = run_example("parameter_server.py", "--steps", "20", "--nodes", "3", "--collect", "gather")
    assert "node 1's calls: barrier x1, broadcast x20, gather x20" in gathered
    loss = re.search(r"^\| parameter server \| ([\d.]+) \| ([\d,]+) \| nccl \| ([^|]+) \|", gathered, re.M)
    assert abs(float(loss.group(1)) - float(ps[1])) < 1e-3 and loss.group(2) == ps[2]
    assert loss.group(3) != rows["parameter server", "nccl"][4]  # a gather is not the reduce's chain


@pytest.mark.slow
def test_compare_strategies_example_runs(tmp_path):
    out = run_example("compare_strategies.py", "--steps", "20", "--nodes", "2", "--out", str(tmp_path / "cs.png"))
    assert "DiLoCo" in out and "DeMo" in out and (tmp_path / "cs.png").exists()


@pytest.mark.slow
def test_char_lm_example_runs(tmp_path):
    out = run_example("char_lm.py", "--steps", "20", "--nodes-list", "1", "2", "--H", "10",
                      "--out", str(tmp_path / "lm.png"))
    assert "| 2 |" in out


@pytest.mark.slow
def test_what_if_bandwidth_example_finds_the_crossover_code_path(tmp_path):
    out = run_example("what_if_bandwidth.py", "--steps", "20", "--nodes", "2", "--points", "3", "--target-loss", "2.2",
                      "--out", str(tmp_path / "wi.png"))
    assert "10 Mbit/s" in out and (tmp_path / "wi.png").exists()


@pytest.mark.slow
def test_time_budget_example_gives_every_strategy_the_same_simulated_time():
    out = run_example("time_budget.py", "--budget", "2", "--nodes", "2", "--max-steps", "300")
    rows = {m.group(1).strip(): (int(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^(DDP|DiLoCo H=25|Streaming DiLoCo 4-bit)\s+(\d+)\s+([\d.]+)s", out, re.M)}
    assert len(rows) == 3
    for steps, sim in rows.values():
        assert sim >= 2.0 or steps == 300  # the budget was spent, or the cap reached first
    assert rows["DiLoCo H=25"][0] > 5 * rows["DDP"][0]  # it talks 25x less, so it takes many more steps


@pytest.mark.slow
def test_async_study_example_compares_five_ways_to_share_work(tmp_path):
    out = run_example("async_study.py", "--budget", "20", "--H", "5", "--plot", str(tmp_path / "async.png"))
    rows = re.findall(r"^\| (sync DiLoCo|async DiLoCo \(naive\)|async DiLoCo DN\+DyLU|FedBuff B=2|"
                      r"deadline DiLoCo 32 s) "
                      r"\| (\d+)/(\d+)/(\d+)/(\d+) \|", out, re.M)
    assert len(rows) == 5 and (tmp_path / "async.png").exists()
    steps = {name: [int(s) for s in counts] for name, *counts in rows}
    assert len(set(steps["sync DiLoCo"])) == 1  # the slowest worker gates every round
    assert steps["async DiLoCo (naive)"][0] > 4 * steps["async DiLoCo (naive)"][3]  # fast workers do more


@pytest.mark.slow
def test_clusters_of_hosts_prints_one_row_per_strategy():
    out = run_example("clusters_of_hosts.py", "--steps", "2", "--params", "1e7")
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| strategy")]
    assert [r.split(" | ")[0][2:] for r in rows] == ["ddp", "diloco:H=50", "streaming_diloco:H=50",
                                                     "async_diloco:H=50", "demo"]
    assert "%" in rows[0]  # DDP is estimated, flat and in hosts


@pytest.mark.slow
def test_time_aware_study_places_the_server_and_tables_validation_loss(tmp_path):
    out = run_example("time_aware_study.py", "--budget", "0.4", "--H", "5", "--out", str(tmp_path / "ta.png"))
    assert "ranks 0-1      us" in out and "ranks 2-3      eu" in out and "ranks 4        us" in out
    assert "(loss: validation)" in out and "payload/server" in out and (tmp_path / "ta.png").exists()


def test_decoupled_goodput_example_prints_the_grid_and_lands_on_the_published_cells(tmp_path):
    out = run_example("decoupled_goodput.py", "--json", "--plot", str(tmp_path / "g.png"), timeout=300)
    rows = json.loads(out)["rows"]
    assert {r["method"] for r in rows} == {"dp", "elastic", "M=2", "M=4", "M=8", "M=16"}
    assert {r["chips"] for r in rows} == {150_000, 300_000, 600_000, 1_200_000, 2_400_000} and len(rows) == 30
    assert all(set(r) == {"method", "chips", "goodput"} and 0 < r["goodput"] < 1 for r in rows)
    cell = {(r["method"], r["chips"]): r["goodput"] for r in rows}
    for method, published in (("dp", 0.27), ("elastic", 0.58), ("M=8", 0.88), ("M=16", 0.93)):
        assert cell[method, 1_200_000] == pytest.approx(published, abs=0.03), method
    assert (tmp_path / "g.png").stat().st_size > 0
    table = run_example("decoupled_goodput.py").split("\n\n", 1)[1].strip()
    assert table in (ROOT / "strategies" / "README.md").read_text(encoding="utf-8")  # the README's table is this run's
