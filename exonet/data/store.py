"""Where shards and uploaded runs live: a local folder or an S3 prefix, behind one small interface.

This is exonet's one S3 client: datasets read through it and ``fit(upload_to=...)`` writes through it
(exonet.runtime.storage), so both get the same retries and the same errors.

``open_store(url)`` takes ``s3://bucket/prefix``, ``file:///path`` or a plain path. An
S3 store builds its boto3 client lazily in the process that uses it (a node, a DataLoader
worker), so the store pickles as just its URL and options. Endpoint, credentials and
region come from the standard AWS environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, profiles ...) unless given as arguments.

Transient failures (connection drops, timeouts, 5xx, throttling) are retried with
exponential backoff and jitter by this module alone (botocore's own retries are turned
off, so the count is the one you set); a missing bucket, prefix or key is a
FileNotFoundError naming it at once.
"""

from __future__ import annotations

import logging
import os
import random
import time
from pathlib import Path
from typing import Any, Callable, TypeVar
from urllib.parse import urlparse

from exonet.files import plain_name

log = logging.getLogger(__name__)
T = TypeVar("T")

TRANSIENT_CODES = {"500", "502", "503", "504", "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout",
                   "RequestTimeTooSkewed", "Throttling", "ThrottlingException", "RequestLimitExceeded"}
CHUNK = 1 << 20


class LocalStore:
    """Shards in a folder on this machine (``file://`` URL or a path); a name is a plain file name in it."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.url = str(self.root)

    def path(self, name: str) -> Path:
        """The file ``name`` in this folder; ValueError unless ``name`` is a plain name (see exonet.files)."""
        return self.root / plain_name(name, f"{self.url}: file name")

    def read(self, name: str) -> bytes:
        file = self.path(name)
        if not file.exists():
            where = "no such folder" if not self.root.is_dir() else "no such file"
            raise FileNotFoundError(f"{file}: {where}")
        return file.read_bytes()

    def write(self, name: str, data: bytes) -> None:
        file = self.path(name)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{name}.tmp-{os.getpid()}"
        tmp.write_bytes(data)
        os.replace(tmp, file)


class S3Store:
    """Shards under ``s3://bucket/prefix``.

    Args:
        url: ``s3://bucket/prefix``.
        retries: how many times a transient failure is retried (0: never).
        backoff_s: the first retry's delay; each further one doubles it (with jitter), capped at 20 s.
        endpoint_url, region, aws_access_key_id, aws_secret_access_key, aws_session_token: override the
            AWS environment.
    """

    def __init__(self, url: str, *, retries: int = 5, backoff_s: float = 0.2, endpoint_url: str | None = None,
                 region: str | None = None, aws_access_key_id: str | None = None,
                 aws_secret_access_key: str | None = None, aws_session_token: str | None = None) -> None:
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise ValueError(f"expected an s3://bucket/prefix URL, got {url!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
        self.bucket, self.prefix = parsed.netloc, parsed.path.strip("/")
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.retries, self.backoff_s = retries, backoff_s
        self.options = {k: v for k, v in (("endpoint_url", endpoint_url), ("region_name", region),
                                          ("aws_access_key_id", aws_access_key_id),
                                          ("aws_secret_access_key", aws_secret_access_key),
                                          ("aws_session_token", aws_session_token)) if v is not None}
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}  # a client never travels: each process makes its own

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def client(self) -> Any:
        if self._client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError:
                raise ImportError("S3 (s3:// datasets, fit(upload_to=...)) needs boto3: "
                                  "pip install 'exonet[s3]'") from None
            config = Config(retries={"total_max_attempts": 1}, connect_timeout=10, read_timeout=60)
            self._client = boto3.session.Session().client("s3", config=config, **self.options)
        return self._client

    def read(self, name: str) -> bytes:
        return self._retry(name,
                           lambda: self.client().get_object(Bucket=self.bucket, Key=self.key(name))["Body"].read())

    def download(self, name: str, folder: Path, size: int | None = None) -> Path:
        """Stream the object ``name`` to the file of that name in ``folder`` (through a temporary file: a broken
        transfer leaves nothing); ``name`` must be a plain file name, so the file stays in ``folder``.

        ``size``, the bytes an index declares, is checked against the object's length before a byte is
        fetched, and against what arrives (an oversized object is never downloaded whole).
        """
        dest = folder / plain_name(name, f"{self.url}: object name")
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        where = f"s3://{self.bucket}/{self.key(name)}"

        def fetch() -> None:
            response = self.client().get_object(Bucket=self.bucket, Key=self.key(name))
            body, length = response["Body"], response.get("ContentLength")
            if size is not None and length is not None and length != size:
                body.close()
                raise ValueError(f"{where}: {length:,} bytes, but the index declares {size:,}: not downloaded")
            got = 0
            with open(tmp, "wb") as f:
                for chunk in body.iter_chunks(CHUNK):
                    got += len(chunk)
                    if size is not None and got > size:
                        body.close()
                        raise ValueError(f"{where}: more than the {size:,} bytes the index declares: download stopped")
                    f.write(chunk)
            os.replace(tmp, dest)

        try:
            self._retry(name, fetch)
        finally:
            tmp.unlink(missing_ok=True)
        return dest

    def write(self, name: str, data: bytes) -> None:
        self._retry(name, lambda: self.client().put_object(Bucket=self.bucket, Key=self.key(name), Body=data))

    def upload(self, path: Path, name: str) -> None:
        """Copy the local file ``path`` to ``name`` under this prefix (boto3's multipart transfer, retried)."""
        self._retry(name, lambda: self.client().upload_file(str(path), self.bucket, self.key(name)))

    # ----------------------------------------------------------- failures
    def _retry(self, name: str, call: Callable[[], T]) -> T:
        for attempt in range(self.retries + 1):
            try:
                return call()
            except Exception as exc:  # noqa: BLE001 - sorted into missing / transient / other below
                missing = self._missing(name, exc)
                if missing is not None:
                    raise FileNotFoundError(missing) from None
                if not _transient(exc) or attempt == self.retries:
                    if _transient(exc):
                        raise OSError(f"s3://{self.bucket}/{self.key(name)}: still failing after {self.retries} "
                                      f"retries ({type(exc).__name__}: {exc})") from exc
                    raise
                delay = min(20.0, self.backoff_s * 2 ** attempt) * random.uniform(0.5, 1.0)
                log.warning("s3://%s/%s: %s: %s; retry %d of %d in %.2f s", self.bucket, self.key(name),
                            type(exc).__name__, exc, attempt + 1, self.retries, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    def _missing(self, name: str, exc: Exception) -> str | None:
        code = _code(exc)
        if code == "NoSuchBucket":
            return f"s3://{self.bucket}: no such bucket (endpoint {self.client().meta.endpoint_url})"
        if code not in ("NoSuchKey", "404", "NotFound"):
            return None
        where = f"s3://{self.bucket}/{self.key(name)}: no such key"
        if name != "index.json":
            return where
        try:
            listed = self.client().list_objects_v2(Bucket=self.bucket, Prefix=self.key(""), MaxKeys=1)
        except Exception:  # noqa: BLE001 - the listing only enriches the message
            return where
        if not listed.get("KeyCount"):
            return f"{where}: nothing is stored under the prefix {self.url}/ (write shards there with " \
                   "exonet.data.write_shards)"
        return f"{where}: {self.url}/ holds objects but no shard index (write shards there with " \
               "exonet.data.write_shards)"


def _code(exc: Exception) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code")) or None
    return None


def _transient(exc: Exception) -> bool:
    if _code(exc) in TRANSIENT_CODES:
        return True
    try:
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError, IncompleteReadError
    except ImportError:
        return False
    # HTTPClientError: connection closed, read timeout, a broken response stream
    return isinstance(exc, (BotoConnectionError, HTTPClientError, IncompleteReadError, ConnectionError, TimeoutError))


def open_store(url: str | os.PathLike, **options: Any) -> LocalStore | S3Store:
    """The store a URL names: ``s3://bucket/prefix`` (options go to S3Store), ``file:///path`` or a path."""
    text = os.fspath(url)
    parsed = urlparse(text)
    if parsed.scheme == "s3":
        return S3Store(text, **options)
    if options:
        raise TypeError(f"{', '.join(sorted(options))}: only for s3:// URLs, got {text!r}")
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"expected file:///absolute/path, got {text!r}")
        return LocalStore(parsed.path)
    if parsed.scheme and len(parsed.scheme) > 1:  # "c:" is a Windows drive, not a scheme
        raise ValueError(f"expected s3://bucket/prefix, file:///path or a folder path, got {text!r}")
    return LocalStore(text)
