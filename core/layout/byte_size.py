"""Byte counts as every message and table writes them: ``512 bytes``, ``1.50 MiB``.

Binary units, as ``lerobot plan``'s device memory (GiB per rank) and ``df -h`` use;
``exact`` adds the count itself, for comparing with ``df -B1`` or a file's size.
"""

from __future__ import annotations

_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def byte_size(nbytes: int, *, exact: bool = False) -> str:
    """``512 bytes``, ``12.34 MiB``, or with ``exact`` ``12.34 MiB (12939428 bytes)``."""
    for unit, size in _UNITS:
        if nbytes >= size:
            readable = f"{nbytes / size:.2f} {unit}"
            return f"{readable} ({nbytes} bytes)" if exact else readable
    return f"{nbytes} bytes"
