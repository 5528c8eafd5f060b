"""What a run directory's files can do when read back: data only, checked against where they were found."""

from __future__ import annotations

import pytest

from exonet.files import plain_name


@pytest.mark.parametrize("name", ["/etc/passwd", "../other", "..", ".", "", "a/b", "a\\b", "C:x", "x\0y", None, 3])
def test_a_name_read_from_a_file_stays_inside_its_folder(name):
    with pytest.raises(ValueError, match=r"^latest.json: dir: .* is not a plain name inside its folder"):
        plain_name(name, "latest.json: dir")


@pytest.mark.parametrize("name", ["step-00000004", "node-0.pt", "shard.bin", "...x", "a..b"])
def test_a_plain_name_passes(name):
    assert plain_name(name, "latest.json: dir") == name
