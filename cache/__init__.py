"""The on-disk kernel store (installed as ``mono_jit.cache``).

Layers: read-only roots first (``MONO_JIT_CACHE_PATH``), then one writable root. Entries are
``<root>/v1/<arch>/<key[:2]>/<key>/{kernel.hsaco, meta.json}``, immutable once published by one
directory rename, so reads take no lock. See store.py for the entry rules, lock.py for single
flight, gc.py for eviction and bundle.py for export / import.
"""

from .key import FORMAT_VERSION, cache_key, key_factors
from .meta import EntryMeta
from .store import Entry, Store

__all__ = ["FORMAT_VERSION", "Entry", "EntryMeta", "Store", "cache_key", "key_factors"]
