"""Every repository path a README names exists, so references cannot drift from the tree (issue 32).

Checked: relative links ``[text](path)`` and backticked paths that start at a top-level folder
(``exonet/netsim/tcp.py``, ``tests/test_docs.py``). Bare file names (``base.py``, ``config.json``)
name files in a run directory or beside the README and are not checked; neither is CHANGES.md,
which records paths as they were.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOP = ("exonet", "strategies", "scenarios", "tests", "examples", ".ci")
DOCS = sorted(p for p in ROOT.rglob("*.md")
              if not {".git", ".venv", "build"} & set(p.relative_to(ROOT).parts) and p.name != "CHANGES.md")


def named_paths(text: str) -> set[str]:
    """The repository paths a markdown text names (see the module docstring)."""
    links = {m[1] for m in re.finditer(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in m[1]}
    ticks = {m[1] for m in re.finditer(r"`([A-Za-z0-9_.][A-Za-z0-9_./-]*/[A-Za-z0-9_./-]*)`", text)
             if m[1].split("/")[0] in TOP}
    return {p.rstrip(".,:;") for p in links | ticks}


def test_the_reader_finds_links_and_rooted_paths():
    text = "see [a](../b/c.md#x), [w](https://x.org/y), `exonet/netsim/tcp.py`, `base.py`, `a/b`"
    assert named_paths(text) == {"../b/c.md", "exonet/netsim/tcp.py"}


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_every_path_a_readme_names_exists(doc: Path):
    missing = sorted(p for p in named_paths(doc.read_text())
                     if not (doc.parent / p).exists() and not (ROOT / p).exists())
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {missing}"
