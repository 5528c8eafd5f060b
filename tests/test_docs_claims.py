"""Claims the docs make about the code, checked against it so they cannot drift: each package's module list, the
core dependencies the README names, and the strategies its opening paragraph lists."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

import exonet.strategies

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.parent for p in (ROOT / "exonet").glob("*/__init__.py"))
# How the README's opening paragraph names each strategy class (aliases of DDPStrategy are the same strategy)
PROSE = {
    "DDPStrategy": "DDP", "FedAvgStrategy": "FedAvg", "DiLoCoStrategy": "DiLoCo", "SPARTAStrategy": "SPARTA",
    "DeMoStrategy": "DeMo", "SPARTADiLoCoStrategy": "SPARTA-DiLoCo", "StreamingDiLoCoStrategy": "Streaming DiLoCo",
    "AsyncDiLoCoStrategy": "asynchronous DiLoCo", "FedBuffStrategy": "FedBuff",
    "DecoupledDiLoCoStrategy": "Decoupled DiLoCo", "SparseLoCoStrategy": "SparseLoCo", "NoLoCoStrategy": "NoLoCo",
    "MuLoCoStrategy": "MuLoCo",
}
ALIASES = {"AllReduceStrategy", "SimpleReduceStrategy", "Strategy"}


@pytest.mark.parametrize("package", PACKAGES, ids=[p.name for p in PACKAGES])
def test_each_package_docstring_names_every_module(package: Path) -> None:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    modules = sorted(f.stem for f in package.glob("*.py") if not f.stem.startswith("_"))
    named = set(re.findall(r"``(\w+)``", doc)) | set(re.findall(rf"exonet\.{package.name}\.(\w+)", doc))
    assert [m for m in modules if m not in named] == [], f"{package.name}/__init__.py's docstring leaves these out"


def test_the_readme_names_the_core_dependencies_pyproject_has() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = sorted(re.split(r"[<>=;\s\[]", d, maxsplit=1)[0] for d in deps if "python_version" not in d)
    line = next(l for l in (ROOT / "README.md").read_text().splitlines() if "pip install -e ." in l and "core:" in l)
    listed = sorted(re.sub(r"[<>=].*", "", x.strip()) for x in line.split("core:", 1)[1].split(","))
    assert listed == names, f"README's install line lists {listed}, pyproject.toml's dependencies are {names}"


def test_the_opening_paragraph_lists_every_strategy() -> None:
    classes = {n for n in exonet.strategies.__all__ if n.endswith("Strategy")} - ALIASES
    assert classes == set(PROSE), "a strategy was added or removed: name it in PROSE and in the README"
    opening = (ROOT / "README.md").read_text().split("\n\n")[2]
    assert opening.startswith("You hand exonet a model")
    missing = [name for name in PROSE.values() if name not in opening]
    assert missing == [], f"README's opening paragraph does not name {missing}"
