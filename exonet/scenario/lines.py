"""Where a key sits in a scenario's TOML text, so an error can name file:line as well as the key.

The schema's errors name a key by its path ("network.nccl.channels", "links[1].bandwidth"); this
module finds the line that sets it by following the document's table headers (``[network]``,
``[network.nccl]``, ``[[links]]``) and keys (dotted keys and inline tables included). A path it
cannot find (a key the error says is missing) gets no line.
"""

from __future__ import annotations

import re

_HEADER = re.compile(r"^\s*\[(\[)?\s*([^\]]+?)\s*\]\]?")
_KEY = re.compile(r'^\s*("[^"]*"|[A-Za-z0-9_.\-\s]+?)\s*=')
_PATH = re.compile(r"^[A-Za-z_][\w\-]*(\[\d+\])?(\.[A-Za-z_][\w\-]*(\[\d+\])?)*$")

Part = str | tuple[str, int]


def _parts(path: str) -> list[Part]:
    """"links[1].bandwidth" as [("links", 1), "bandwidth"]."""
    out: list[Part] = []
    for piece in path.split("."):
        name, _, index = piece.partition("[")
        out.append((name, int(index.rstrip("]"))) if index else name)
    return out


def _names(dotted: str) -> list[str]:
    return [p.strip().strip('"') for p in dotted.split(".")]


def key_line(text: str, path: str) -> int | None:
    """The 1-based line of ``text`` that sets ``path`` (or the table or inline table holding it), else None."""
    target = _parts(path)
    table: list[Part] = []
    arrays: dict[str, int] = {}
    best: tuple[int, int] | None = None  # (depth of the match, line)
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            names: list[Part] = list(_names(header.group(2)))
            if header.group(1):  # [[name]]: the next element of an array of tables
                key = ".".join(str(n) for n in names)
                arrays[key] = arrays.get(key, -1) + 1
                names[-1] = (str(names[-1]), arrays[key])
            table = names
            full = table
        else:
            pair = _KEY.match(line)
            if not pair:
                continue
            full = [*table, *_names(pair.group(1))]
        if full == target:
            return number
        if target[: len(full)] == full and (best is None or len(full) > best[0]):
            best = (len(full), number)
    return None if best is None else best[1]


def with_line(message: str, text: str, source: str) -> str:
    """``message`` (which starts "source: key.path: ...") with the key's line: "source:12: key.path: ..."."""
    head = f"{source}: "
    if not message.startswith(head):
        return message
    rest = message[len(head):]
    path = rest.split(":", 1)[0].strip()
    line = key_line(text, path) if _PATH.match(path) else None
    return message if line is None else f"{source}:{line}: {rest}"
