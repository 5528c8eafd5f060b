"""Copying a finished run directory to S3 (the ``s3`` extra), so sweeps on many machines meet in one place.

The transfer goes through exonet's one S3 client (``exonet.data.store.S3Store``): the same retries with
backoff, the same AWS environment (``AWS_ENDPOINT_URL``, credentials, region) and the same errors as
datasets read from S3.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from exonet.data.store import S3Store


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` → (bucket, prefix without slashes at either end)."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"upload_to: expected an s3://bucket/prefix URL, got {url!r}")
    return parsed.netloc, parsed.path.strip("/")


def upload_run(run_dir: Path, url: str, *, retries: int = 5) -> list[str]:
    """Upload every file of ``run_dir`` under ``s3://bucket/prefix/<run folder name>/``; returns the keys.

    status.json goes last, so a reader that sees it knows the rest is there.
    """
    bucket, prefix = parse_s3_url(url)
    store = S3Store(f"s3://{bucket}/{'/'.join(filter(None, (prefix, run_dir.name)))}", retries=retries)
    files = sorted((p for p in run_dir.rglob("*") if p.is_file()), key=lambda p: (p.name == "status.json", str(p)))
    keys = []
    for path in files:
        name = path.relative_to(run_dir).as_posix()
        store.upload(path, name)
        keys.append(store.key(name))
    return keys
