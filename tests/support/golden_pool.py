"""A stand-in for the compile workers that answers each job with the golden cache's entry for the
same key, for tests that need a compile to happen (a miss filled, an entry published, a rebuild
verified) but not a compiler: prebuild, resolve and verify run their own code, minus the compile."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import pytest
from cache_settings import settings_at

from mono_jit.cache import Store
from mono_jit.pipeline.workers import Outcome

# router + keytable at ratio 4 and 128 (8192 = a 1M context), max_tokens 1: cache_settings.SMALL_SPECS,
# three keys, all in the golden cache.
PREBUILD = ["prebuild", "--template", "router,keytable", "--ratio", "4,128", "--max-tokens", "1", "--jobs", "1"]


def answer_compiles_from(cache: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """Replace the worker pool of prebuild, resolve and verify with answers read from `cache`
    (looked up read-only: nothing there is stamped or quarantined); returns that cache's store.
    A key `cache` does not hold fails the test by name."""
    source = Store(settings_at(cache), read_only=True)

    class GoldenPool:
        def __init__(self, *args: object) -> None:
            pass

        def __enter__(self) -> "GoldenPool":
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def run(self, items: Iterable[tuple | None]) -> Iterator[Outcome]:
            for item in items:
                if item is not None:
                    entry = source.lookup(item[0], "gfx950")
                    assert entry is not None, f"the golden cache has no entry {item[0]} to answer a compile with"
                    yield Outcome(item[0], "ok", {"hsaco": entry.hsaco, "launches": [launch.to_json() for launch in entry.meta.launches],
                                                  "seconds": 0.0})

    monkeypatch.setattr("mono_jit.pipeline.workers.WorkerPool", GoldenPool)
    return source
