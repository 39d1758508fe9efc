"""Downloads with checksum verification, and safe archive extraction.

A download goes to a temporary file next to its destination and is renamed into place only
after its checksum matched; on any failure the partial file is removed. ``$CIOSL_MIRROR``
(a base URL) replaces every official mirror: the file name is appended to it (used by the
tests with a local HTTP server, and by users behind a proxy or with a local copy).
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """A file could not be fetched (offline, server error) or failed verification."""


class ChecksumError(DownloadError):
    """The fetched file's checksum differs from the expected one."""


def file_hash(path: str | Path, algorithm: str = "md5") -> str:
    """Hex digest of a file, read in chunks."""
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def mirror_urls(filename: str, mirrors: Sequence[str]) -> list[str]:
    """Candidate URLs for ``filename``: ``$CIOSL_MIRROR`` alone if set, else ``mirrors``."""
    override = os.environ.get("CIOSL_MIRROR")
    bases = [override] if override else list(mirrors)
    return [b.rstrip("/") + "/" + filename for b in bases]


def download_url(
    urls: str | Sequence[str],
    dest: str | Path,
    checksum: str,
    *,
    algorithm: str = "md5",
    timeout: float = 60.0,
) -> Path:
    """Fetch the first reachable URL to ``dest`` and verify its checksum.

    An existing ``dest`` with the right checksum is kept as it is. Raises ``ChecksumError``
    on a mismatch (nothing is left at ``dest``) and ``DownloadError`` when no URL answers.
    """
    dest = Path(dest)
    if dest.is_file() and file_hash(dest, algorithm) == checksum.lower():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for url in [urls] if isinstance(urls, str) else list(urls):
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        try:
            h = hashlib.new(algorithm)
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as r:
                while chunk := r.read(CHUNK):
                    out.write(chunk)
                    h.update(chunk)
            if h.hexdigest() != checksum.lower():
                raise ChecksumError(
                    f"{url}: {algorithm} checksum {h.hexdigest()} != expected {checksum}; "
                    "the file was removed (corrupted download or wrong mirror)"
                )
            os.replace(tmp, dest)
            return dest
        except (urllib.error.URLError, OSError) as e:
            errors.append(f"{url}: {e}")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise DownloadError(
        f"could not download {dest.name} (offline? set $CIOSL_MIRROR to a reachable mirror, "
        "or place the file there yourself): " + "; ".join(errors)
    )


def extract_tar(archive: str | Path, dest: str | Path) -> Path:
    """Extract a tar archive into ``dest``, refusing members that would land outside it."""
    dest = Path(dest).resolve()
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            target = (dest / m.name).resolve()
            if not target.is_relative_to(dest) or m.issym() or m.islnk() or m.isdev():
                raise DownloadError(f"{archive}: unsafe archive member {m.name!r} refused")
        # the "data" filter (Python >= 3.10.12) re-checks paths and drops unsafe modes
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, **kw)
    return dest
