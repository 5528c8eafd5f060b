"""Copying a finished run directory to S3 (the ``s3`` extra), so sweeps on many machines meet in one place.

boto3 is imported lazily; credentials and region come from boto3's usual sources.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` → (bucket, prefix without slashes at either end)."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"upload_to: expected an s3://bucket/prefix URL, got {url!r}")
    return parsed.netloc, parsed.path.strip("/")


def upload_run(run_dir: Path, url: str) -> list[str]:
    """Upload every file of ``run_dir`` under ``s3://bucket/prefix/<run folder name>/``; returns the keys.

    status.json goes last, so a reader that sees it knows the rest is there.
    """
    bucket, prefix = parse_s3_url(url)
    try:
        import boto3
    except ImportError:
        raise ImportError("fit(upload_to='s3://...') needs boto3: pip install 'exonet[s3]'") from None
    client = boto3.client("s3")
    files = sorted((p for p in run_dir.rglob("*") if p.is_file()), key=lambda p: (p.name == "status.json", str(p)))
    keys = []
    for path in files:
        key = "/".join(filter(None, (prefix, run_dir.name, path.relative_to(run_dir).as_posix())))
        client.upload_file(str(path), bucket, key)
        keys.append(key)
    return keys
