"""Reference tables generated from the code, so the READMEs that show them cannot drift from it.

``fit_arguments()`` renders ``LocalTrainer.fit``'s signature and the Args section of its
docstring as a markdown table; ``exonet/runtime/README.md`` holds its output, and a test
checks that the two are the same (``python -m exonet.runtime.reference`` prints it).
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable


def documented_args(fn: Callable[..., Any]) -> dict[str, str]:
    """The Args section of ``fn``'s docstring: each name (``**legacy`` as ``legacy``) and its text, on one line."""
    doc = inspect.getdoc(fn) or ""
    section = doc.split("Args:", 1)[1] if "Args:" in doc else ""
    out: dict[str, str] = {}
    name = None
    for line in section.splitlines():
        if not line.strip():
            if out:
                break
            continue
        head = re.match(r"^ {4}(?:\*\*)?(\w+): (.*)$", line)
        if head:
            name = head[1]
            out[name] = head[2].strip()
        elif name is not None and line.startswith(" " * 8):
            out[name] += " " + line.strip()
        else:
            break
    return out


def _cell(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|")


def fit_arguments() -> str:
    """``LocalTrainer.fit``'s arguments as a markdown table: name, default, meaning (from the code)."""
    from exonet.runtime.trainer import LocalTrainer

    said = documented_args(LocalTrainer.fit)
    rows = ["| argument | default | meaning |", "|---|---|---|"]
    for name, p in inspect.signature(LocalTrainer.fit).parameters.items():
        if name == "self":
            continue
        if name not in said:
            raise ValueError(f"LocalTrainer.fit: argument {name!r} is not in its docstring's Args")
        default = ("required" if p.default is inspect.Parameter.empty and p.kind != p.VAR_KEYWORD
                   else "" if p.kind == p.VAR_KEYWORD else f"`{p.default!r}`")
        shown = f"`**{name}`" if p.kind == p.VAR_KEYWORD else f"`{name}`"
        rows.append(f"| {shown} | {default} | {_cell(said[name])} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(fit_arguments())
