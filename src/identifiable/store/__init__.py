"""Low-level storage shared by every floor: atomic files, checksums, the shard cache.

Nothing here knows about models, analyses or the report; every layer may import it.
"""

from identifiable.store.cache import CACHE_DIR, CacheCorruptWarning, RunCache, settings_key
from identifiable.store.files import (
    atomic_write_bytes,
    atomic_write_text,
    sha256_bytes,
    sha256_file,
    table_bytes,
    write_table,
)

__all__ = [
    "CACHE_DIR",
    "CacheCorruptWarning",
    "RunCache",
    "atomic_write_bytes",
    "atomic_write_text",
    "settings_key",
    "sha256_bytes",
    "sha256_file",
    "table_bytes",
    "write_table",
]
