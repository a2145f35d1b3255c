"""numba's cache of the interpreter follows every source of the emulator, not only the file of
each function: an edited constant in another module is compiled in, not served stale."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba", reason="the emulator needs the emulate extra (numba, tinygrad)")

import mono_jit.emulator  # noqa: E402

# The SDWA select of the word above bit 16 (WORD_1 = 5) on one row: with SEL_DWORD = 6 (decode.py)
# it picks the upper half; with decode.py's SEL_DWORD edited to 5 the row is kept whole.
PROBE = """
import json, sys
import numpy as np
from copied.emulator.operands import sdwa_select
T = np.full((1, 64), 0x12345678, np.uint32)
sdwa_select(T, 0, 5, 0)
stats = sdwa_select.stats
print(json.dumps({"value": int(T[0, 0]), "hits": sum(stats.cache_hits.values()),
                  "misses": sum(stats.cache_misses.values())}))
"""


def _probe(root: Path, numba_cache: Path) -> dict[str, int]:
    env = dict(os.environ, PYTHONPATH=str(root), NUMBA_CACHE_DIR=str(numba_cache))
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_an_edited_constant_in_another_module_is_compiled_in_not_served_stale(tmp_path):
    package = Path(mono_jit.emulator.__file__).parent
    (tmp_path / "copied").mkdir()
    (tmp_path / "copied" / "__init__.py").write_text("")
    shutil.copy(package.parent / "errors.py", tmp_path / "copied" / "errors.py")  # the emulator's errors' base
    copy = tmp_path / "copied" / "emulator"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    numba_cache = tmp_path / "numba"
    first = _probe(tmp_path, numba_cache)
    assert first == {"value": 0x1234, "hits": 0, "misses": 1}, first
    again = _probe(tmp_path, numba_cache)
    assert again == {"value": 0x1234, "hits": 1, "misses": 0}, "an unchanged emulator loads its cached code"
    decode = copy / "decode.py"
    text = decode.read_text()
    assert "SEL_DWORD = 6" in text
    decode.write_text(text.replace("SEL_DWORD = 6", "SEL_DWORD = 5"))
    edited = _probe(tmp_path, numba_cache)
    assert edited["value"] == 0x12345678, f"stale machine code ran after decode.py changed: {edited}"


def test_the_digest_covers_the_subpackages_sources(tmp_path):
    """The clock's recorder (emulator/clock/) is compiled into the interpreter: its edits must
    move the cache too."""
    from mono_jit.emulator.jit_cache import sources_digest

    (tmp_path / "top.py").write_text("A = 1\n")
    (tmp_path / "clock").mkdir()
    (tmp_path / "clock" / "trace.py").write_text("B = 1\n")
    before = sources_digest(tmp_path)
    (tmp_path / "clock" / "trace.py").write_text("B = 2\n")
    assert sources_digest(tmp_path) != before
