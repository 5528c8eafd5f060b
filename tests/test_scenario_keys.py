"""The scenarios README's table of every key matches the schema both ways (issue 32, references that cannot drift)."""

from __future__ import annotations

import re
from pathlib import Path

from exonet.scenario import schema

README = Path(__file__).resolve().parents[1] / "scenarios" / "README.md"
NESTED = {"network.nccl": schema.NETWORK["nccl"], "network.algorithms": schema.NETWORK["algorithms"]}


def schema_keys() -> set[str]:
    """Every key a scenario file may hold, dotted (``network.nccl.nic``; ``links[].latency`` for arrays of tables)."""
    keys = {"name", "description"}
    for table, spec in schema.TABLES.items():
        keys |= {f"{table}.{key}" for key in spec if f"{table}.{key}" != "network.nccl"}
    keys |= {f"network.nccl.{key}" for key in ("algorithm", "protocol", "channels", "nic", "transport",
                                                "socket_threads", "socks_per_thread", "buffsize")}
    keys |= {f"{array}[].{key}" for array, spec in schema.ARRAYS.items() for key in spec}
    return keys


def readme_keys() -> set[str]:
    section = README.read_text().split("### Every key", 1)[1]
    table = re.search(r"^\|.*?(?=\n\n)", section, flags=re.M | re.S)
    assert table is not None, f"{README}: no table under 'Every key'"
    return {m[1] for m in re.finditer(r"^\| `([^`]+)` \|", table[0], flags=re.M)}


def test_every_schema_key_is_in_the_readme_table_and_nothing_else():
    assert readme_keys() == schema_keys()


def test_the_nccl_keys_listed_are_the_schemas():
    """The table's nccl keys are read from the validator itself: an unknown key names the valid ones."""
    try:
        NESTED["network.nccl"]({"nope": 1}, "s.toml: network.nccl")
    except Exception as err:  # noqa: BLE001 - the message is what is checked
        valid = str(err).split("valid keys in [network.nccl]: ")[1].split(", ")
    assert {f"network.nccl.{k}" for k in valid} == {k for k in schema_keys() if k.startswith("network.nccl.")}
