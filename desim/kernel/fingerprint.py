"""The fingerprint of a file: the sha256 of its bytes, read in blocks. Study records, data
files, graph files and R data sets are all fingerprinted with it, so that editing any of them
makes what was computed from it stale."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path) -> str:
    """sha256 (hex) of the bytes of `path`."""
    with Path(path).open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()
