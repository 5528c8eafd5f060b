"""The field's methods at their scale: SparseLoCo at 72B with 20 peers, NoLoCo at 1,000 replicas (exonet estimate).

Each estimate runs as its own ``exonet estimate`` process, as a user runs it; the figures are its wall
time and its peak resident memory (``wait4``'s ``ru_maxrss``), against the targets of 30 s and 2 GiB.

    python -m exonet.bench field [--sparseloco-peers 20] [--noloco-replicas 1000] [--scenario cross-region]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

TARGET_S, TARGET_BYTES = 30.0, 2 << 30


def estimate_command(spec: str, params: float, nodes: int, steps: int, step_time: float, scenario: str) -> list[str]:
    return [sys.executable, "-m", "exonet", "estimate", "--model-params", f"{params:g}", "--strategy", spec,
            "--nodes", str(nodes), "--steps", str(steps), "--step-time", f"{step_time:g}", "--dtype", "bf16",
            "--scenario", scenario]


def timed(command: list[str]) -> dict[str, Any]:
    """Run ``command``; its seconds, peak resident bytes, exit status and the last lines it printed."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None  # PIPE
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"seconds": time.perf_counter() - t0, "peak_bytes": usage.ru_maxrss * 1024, "returncode": proc.returncode,
            "output": out.strip().splitlines()[-4:]}


def main(argv: list[str]) -> dict[str, Any]:
    """Print the figures and return them: per case ``seconds``, ``peak_bytes`` and its output's last lines, and
    ``ok`` (every case exited 0 within both targets)."""
    parser = argparse.ArgumentParser(prog="python -m exonet.bench field", description=__doc__.splitlines()[0])
    parser.add_argument("--sparseloco-peers", type=int, default=20)
    parser.add_argument("--noloco-replicas", type=int, default=1000)
    parser.add_argument("--scenario", default="cross-region")
    args = parser.parse_args(argv)
    cases = {
        f"sparseloco 72B, {args.sparseloco_peers} peers": estimate_command(
            "sparseloco:H=30", 72e9, args.sparseloco_peers, 60, 10.0, args.scenario),
        f"noloco 1B, {args.noloco_replicas} replicas": estimate_command(
            "noloco:H=50", 1e9, args.noloco_replicas, 100, 1.0, args.scenario),
    }
    figures: dict[str, Any] = {"ok": True}
    print(f"field bench: exonet estimate on {args.scenario} (targets {TARGET_S:g} s, {TARGET_BYTES / 2**30:g} GiB)")
    for name, command in cases.items():
        r = figures[name] = timed(command)
        within = r["returncode"] == 0 and r["seconds"] <= TARGET_S and r["peak_bytes"] <= TARGET_BYTES
        figures["ok"] = figures["ok"] and within
        print(f"  {name:34s} {r['seconds']:6.1f} s  {r['peak_bytes'] / 2**20:7.0f} MiB  "
              f"{'within' if within else 'OVER'}")
        for line in r["output"]:
            print(f"    {line}")
    return figures
