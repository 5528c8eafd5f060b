"""Examples run as a user runs them (subprocesses), and their printed claims hold."""

from __future__ import annotations

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
