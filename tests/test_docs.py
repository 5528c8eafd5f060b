"""Every ```python and ```bash/```sh/```shell block in every README.md runs, so the documentation cannot rot.

How each block runs (one test per block, id ``README-path:line``):

- **Python** blocks of one README run in order in one namespace, like a doctest session: one fresh
  interpreter per README (cwd a temporary folder) executes them one after another in its ``__main__``,
  as a notebook would; each block has a timeout. A README whose Python blocks train (``fit(``) has them
  all marked slow, since later blocks build on earlier ones.
- **Shell** blocks: each command (``\\``-continued lines joined, ``&&`` chains split, comments dropped)
  runs for real in a temporary folder holding a link to the repository's ``examples/``, with this
  interpreter's ``python`` and ``exonet`` first on PATH; a non-zero exit fails the test. Except:

  (a) ``pip install ...`` never installs: every extra it names must exist in pyproject.toml, and a torch
      pin must be the one .ci/run installs;
  (b) the test command (``python -m pytest ...``, ``bash .ci/run``) never runs: .ci/run must run the
      README's commands in order (pip's quiet flags aside);
  (c) long-running commands (the quickstart, the examples, the benchmarks) run in their small form:
      the arguments in ``SMALL_FORMS`` are appended to the command as written (argparse lets the last
      occurrence of an option win), and those blocks are marked slow, as are blocks of estimates at scale
      (``SLOW_COMMANDS``: seconds each, and the quick loop has a few minutes in all);
  (d) commands that need what a test machine may not have (root for network namespaces, two hosts)
      are skipped, saying why (``NOT_HERE``); ``tests/test_validate.py`` and ``tests/test_runtime_multihost.py``
      run them where they can;
  (e) a command written bare (no arguments) that another test already runs in a small form and checks
      the output of (``RUN_BY``) is not run a second time: that test must exist and run it.

Blocks that are not code use other fence languages (```text, ```toml); ```toml blocks that are whole
scenarios (they have a ``[network]`` table) must load with ``Scenario.from_toml``.
"""

from __future__ import annotations

import json
import os
import re
import select
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", "build", "dist", "node_modules", ".venv", "venv", "__pycache__", ".pytest_cache"}
SHELL = {"bash", "sh", "shell"}
PYTHON_TIMEOUT_S = 600
SHELL_TIMEOUT_S = 600

SMALL_FORMS: dict[str, list[str]] = {
    "exonet quickstart": ["--steps", "20", "--nodes", "2", "--scenario", "datacenter"],
    "python examples/compare_strategies.py": ["--steps", "20", "--nodes", "2", "--scenarios", "datacenter"],
    "python examples/custom_strategy.py": ["--steps", "20", "--nodes", "2"],
    "python examples/time_budget.py": ["--budget", "2", "--nodes", "2", "--max-steps", "300"],
    "python examples/what_if_bandwidth.py": ["--steps", "20", "--nodes", "2", "--points", "3",
                                             "--target-loss", "2.2"],
    "python examples/char_lm.py": ["--steps", "20", "--nodes-list", "1", "2", "--H", "10"],
    "python examples/field_methods.py": ["--steps", "20", "--H", "5", "--out", "field_methods.png"],
    "python examples/pipeline_across_sites.py": ["--steps", "6", "--H", "3", "--out", "pipeline_across_sites.png"],
    "python examples/async_study.py": ["--budget", "10", "--H", "5"],
    "python examples/torchrun_study.py": ["--steps", "5"],
    "torchrun --standalone": ["--steps", "5"],
    "python -m exonet.bench runtime": ["--nodes", "2", "--steps", "10"],
    "python -m exonet.bench netsim": ["--nodes", "8", "--steps", "20", "--reference-steps", "5"],
    "python -m exonet.bench simulator": ["--nodes", "8", "--steps", "20", "--reference-steps", "5"],
    "python -m exonet.bench communicator": ["--quick"],
    "python -m exonet.bench strategies": ["--quick"],
    "python -m exonet.bench field": ["--sparseloco-peers", "4", "--noloco-replicas", "8"],
    "python -m exonet.bench memory": ["--nodes", "2", "--gib", "0.01", "--kinds", "tensor", "--steps", "3"],
    "python -m exonet.bench scale": ["--nodes", "2", "--steps", "3", "--models", "mlp", "--startup-nodes", "0"],
    "python -m exonet.bench fuzz": ["--examples", "40"],
}
NOT_HERE: dict[str, str] = {
    "sudo ": "needs root and network namespaces (tests/test_validate.py runs it as root)",
    "torchrun --nnodes 2": "needs two hosts (tests/test_runtime_multihost.py runs it in two network namespaces)",
    "exonet validate --calibrate --run runs/": "names a run directory of the reader's own "
                                              "(tests/test_validate_runs.py runs it on a real run)",
}
SLOW_COMMANDS = ("exonet estimate",)
# Bare README commands and the test that runs each (in the same or a larger small form) and checks its output.
RUN_BY: dict[str, tuple[str, str, str]] = {  # command: (test file, test, what its source runs)
    "python examples/compare_strategies.py": ("test_examples.py", "test_compare_strategies_example_runs",
                                              '"compare_strategies.py"'),
    "python examples/custom_strategy.py": ("test_examples.py",
                                           "test_custom_int8_strategy_sends_P_plus_4_bytes_and_learns",
                                           '"custom_strategy.py"'),
    "python examples/time_budget.py": ("test_examples.py",
                                       "test_time_budget_example_gives_every_strategy_the_same_simulated_time",
                                       '"time_budget.py"'),
    "python -m exonet.bench memory": ("test_bench_scale.py",
                                      "test_memory_bench_returns_the_extra_pss_of_a_dataset_against_a_tiny_one",
                                      "memory.main(["),
    "python -m exonet.bench scale": ("test_bench_scale.py",
                                     "test_scale_bench_returns_startup_against_spawn_step_time_and_memory_per_node",
                                     "scale.main(["),
    "python -m exonet.bench strategies": ("test_bench_suite.py",
                                          "test_strategies_bench_checks_demo_against_the_reference_and_times_every_strategy",
                                          "strategies.main(["),
    "python -m exonet.bench communicator": ("test_bench_suite.py",
                                            "test_communicator_bench_returns_both_sides_and_their_ratio_per_size",
                                            "communicator.main(["),
    "python -m exonet.bench fuzz": ("test_bench_fuzz.py", "test_the_fuzz_bench_prints_its_seed_and_runs_every_property",
                                    "fuzz.main(["),
}
PIP_QUIET = {"--quiet", "-q", "--disable-pip-version-check"}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def readmes() -> list[Path]:
    """Every README.md in the repository, outside version control and build folders."""
    found = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        if "README.md" in filenames:
            found.append(Path(dirpath) / "README.md")
    return sorted(found)


FENCE = re.compile(r"^```([\w+-]*)\s*$")


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, with the line of their opening fence."""
    out, lang, start, body = [], None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        m = FENCE.match(line.strip()) if line.startswith("```") else None
        if lang is None and m:
            lang, start, body = m.group(1).lower(), number, []
        elif lang is not None and line.startswith("```"):
            out.append(Block(path, start, lang, "\n".join(body) + "\n"))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"{path}:{start}: a ``` fence is never closed"
    return out


ALL = [b for p in readmes() for b in blocks(p)]
PYTHON = [b for b in ALL if b.lang == "python"]
SHELL_BLOCKS = [b for b in ALL if b.lang in SHELL]
TOML = [b for b in ALL if b.lang == "toml"]


def commands(code: str) -> list[str]:
    """A shell block's commands as written: continuations joined, comments and blank lines dropped, ``&&`` split."""
    out = []
    for line in re.sub(r"\s*\\\n\s*", " ", code).splitlines():
        part, quote, i = "", None, 0
        while i < len(line):
            c = line[i]
            if quote:
                quote = None if c == quote else quote
            elif c in "'\"":
                quote = c
            elif c == "#" and (not part or part[-1].isspace()):
                break
            elif line.startswith("&&", i):
                out.append(part.strip())
                part, i = "", i + 2
                continue
            part += c
            i += 1
        out.append(part.strip())
    return [c for c in out if c]


def check_run_by(command: str) -> None:
    """The test ``RUN_BY`` names for ``command`` exists and its body runs what the command runs."""
    file, name, runs = RUN_BY[command]
    source = (ROOT / "tests" / file).read_text()
    start = source.find(f"def {name}(")
    assert start >= 0, f"RUN_BY: {command!r} names tests/{file}::{name}, which does not exist"
    end = source.find("\ndef ", start + 1)
    assert runs in source[start:end if end > 0 else None], f"RUN_BY: tests/{file}::{name} does not run {runs}"


def small_form(command: str) -> list[str] | None:
    return next((extra for prefix, extra in SMALL_FORMS.items() if command.startswith(prefix)), None)


def _mark(block: Block, slow: bool):
    return pytest.param(block, id=block.id, marks=[pytest.mark.slow] if slow else [])


def _python_params():
    training = {b.path for b in PYTHON if "fit(" in b.code}
    return [_mark(b, b.path in training) for b in PYTHON]


def _shell_params():
    return [_mark(b, any((small_form(c) is not None and c not in RUN_BY) or c.startswith(SLOW_COMMANDS)
                         for c in commands(b.code)))
            for b in SHELL_BLOCKS]


def test_every_command_run_elsewhere_is_in_a_readme_and_its_test_runs_it():
    written = {c for b in SHELL_BLOCKS for c in commands(b.code)}
    for command in RUN_BY:
        assert command in written, f"RUN_BY: no README runs {command!r} any more"
        check_run_by(command)


def test_the_readmes_are_found_and_hold_code():
    names = {str(p.relative_to(ROOT)) for p in readmes()}
    assert "README.md" in names and len(names) >= 8, names
    assert PYTHON and SHELL_BLOCKS
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300


def test_commands_split_continuations_chains_and_comments():
    code = 'pip install -e ".[examples]" && exonet quickstart   # the main job\nexonet estimate --a 1 \\\n  --b 2\n'
    assert commands(code) == ['pip install -e ".[examples]"', "exonet quickstart", "exonet estimate --a 1 --b 2"]
    assert commands("printf 'a # b' > f  # write f\n") == ["printf 'a # b' > f"]


# ---------------------------------------------------------------- Python blocks: one session per README

DRIVER = r"""
import json, sys, traceback
MARK = "\x00EXONET-DOC-RESULT "
ns = sys.modules["__main__"].__dict__
for line in sys.stdin:
    code = json.loads(line)
    try:
        exec(compile(code["source"], code["name"], "exec"), ns)
        result = {"ok": True}
    except BaseException:
        result = {"ok": False, "error": traceback.format_exc()}
    sys.stdout.flush(); sys.stderr.flush()
    print(MARK + json.dumps(result), flush=True)
"""
MARK = "\x00EXONET-DOC-RESULT "


class Session:
    """A fresh interpreter executing one README's Python blocks in order in its ``__main__``."""

    def __init__(self, cwd: Path):
        env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
        self.proc = subprocess.Popen([sys.executable, "-c", DRIVER], cwd=cwd, env=env, bufsize=0,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def run(self, block: Block, timeout: float) -> tuple[bool, str]:
        """Execute one block; (it ran without raising, what it printed and its traceback)."""
        source = "\n" * (block.line) + block.code  # tracebacks name the README's own line numbers
        self.proc.stdin.write((json.dumps({"source": source, "name": str(block.path)}) + "\n").encode())
        output, deadline = b"", time.monotonic() + timeout
        mark = MARK.encode()
        while mark not in output:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                self.close()
                return False, output.decode(errors="replace") + f"\n(timed out after {timeout:.0f} s)"
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                return False, output.decode(errors="replace") + "\n(the interpreter exited)"
            output += chunk
        while not output.endswith(b"\n"):  # the rest of the result line
            output += os.read(self.proc.stdout.fileno(), 65536)
        printed, _, result = output.decode(errors="replace").partition(MARK)
        result = json.loads(result)
        return result["ok"], printed + result.get("error", "")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    opened: dict[Path, Session] = {}

    def session(path: Path) -> Session:
        if path not in opened:
            opened[path] = Session(tmp_path_factory.mktemp(path.parent.name or "top"))
        return opened[path]

    yield session
    for s in opened.values():
        s.close()


@pytest.mark.parametrize("block", _python_params())
def test_python_block_runs(block: Block, sessions):
    ok, output = sessions(block.path).run(block, PYTHON_TIMEOUT_S)
    assert ok, f"{block.id} failed:\n{output[-6000:]}"


# ---------------------------------------------------------------- shell blocks

def extras_in_pyproject() -> set[str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def ci_commands() -> list[list[str]]:
    """.ci/run's commands as word lists, pip's quiet flags dropped and ``python -m pip`` spelt ``pip``."""
    out = []
    for words in (shlex.split(line, comments=True) for line in (ROOT / ".ci" / "run").read_text().splitlines()):
        if not words or words[0] in {"set", "cd"}:
            continue
        if words[:3] == ["python", "-m", "pip"]:
            words = ["pip", *words[3:]]
        out.append([w for w in words if w not in PIP_QUIET])
    return out


def check_pip(command: str) -> None:
    words = shlex.split(command)
    extras = extras_in_pyproject()
    for word in words[2:]:
        for named in re.findall(r"\[([\w,-]+)\]", word):
            for extra in named.split(","):
                assert extra in extras, f"{command!r}: extra {extra!r} is not in pyproject.toml ({sorted(extras)})"
        if word.startswith("torch=="):
            pins = [w for c in ci_commands() for w in c if w.startswith("torch==")]
            assert pins == [word], f"{command!r}: .ci/run pins {pins}, the README {word}"


def check_test_command(block: Block) -> None:
    """.ci/run runs the README's test chain, command by command, in order."""
    wanted = [shlex.split(c) for c in commands(block.code) if not c.startswith("bash .ci/run")]
    ci = ci_commands()
    position = 0
    for words in wanted:
        found = next((i for i in range(position, len(ci)) if ci[i][:len(words)] == words), None)
        assert found is not None, f"{block.id}: .ci/run does not run {shlex.join(words)!r} after its earlier ones: {ci}"
        position = found + 1


def is_test_block(block: Block) -> bool:
    return any("pytest" in c or c.startswith("bash .ci/run") for c in commands(block.code))


@pytest.fixture
def shell_dir(tmp_path) -> Path:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return tmp_path


@pytest.mark.parametrize("block", _shell_params())
def test_shell_block_runs(block: Block, shell_dir: Path):
    if is_test_block(block):
        check_test_command(block)
    env = dict(os.environ, MPLBACKEND="Agg", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    skipped = []
    for command in commands(block.code):
        if command.startswith("pip install"):
            check_pip(command)
            continue
        if "pytest" in command or command.startswith("bash .ci/run"):
            continue
        if command in RUN_BY:
            check_run_by(command)
            continue
        reason = next((why for prefix, why in NOT_HERE.items() if command.startswith(prefix)), None)
        if reason:
            skipped.append(f"{command!r}: {reason}")
            continue
        full = " ".join([command, *map(shlex.quote, small_form(command) or [])])
        proc = subprocess.run(["bash", "-c", full], cwd=shell_dir, env=env, capture_output=True, text=True,
                              timeout=SHELL_TIMEOUT_S)
        assert proc.returncode == 0, (f"{block.id}: {full} exited {proc.returncode}:\n"
                                      f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    if skipped:
        pytest.skip("; ".join(skipped))


# ---------------------------------------------------------------- TOML blocks

@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in TOML])
def test_toml_scenario_block_loads(block: Block):
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    data = tomllib.loads(block.code)
    if "network" not in data:
        pytest.skip("not a whole scenario (no [network] table)")
    from exonet import Scenario

    Scenario.from_toml(block.code)
