"""The suite on a host without vLLM (`scripts/setup.sh` without `--with-vllm`): every test under
tests/vllm skips with its reason. pytest puts tests/ on the path, where the folder tests/vllm
itself looks like a namespace package named vllm, so the check must find only an installed one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_HIDE_VLLM = """
import sys
from pathlib import Path
shadows = dict(arg.split("=", 1) for arg in sys.argv[1:3])
sys.path[:] = [shadows.get(p, p) for p in sys.path]
sys.path_importer_cache.clear()
import pytest
sys.exit(pytest.main(sys.argv[3:]))
"""


def _shadow_site(real: Path, into: Path) -> Path:
    """`real` (a site-packages folder) seen through links to everything in it but vLLM."""
    into.mkdir()
    for item in real.iterdir():
        if item.name != "vllm" and not item.name.startswith("vllm-"):
            (into / item.name).symlink_to(item)
    return into


def test_tests_vllm_skip_with_the_reason_when_vllm_is_not_installed(tmp_path):
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed here: the suite itself shows the skip")
    real = Path(spec.origin).parent.parent
    shadow = _shadow_site(real, tmp_path / "site-packages")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-c", _HIDE_VLLM, f"{real}={shadow}", f"{real}/={shadow}",
         "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist", "tests/vllm"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert " error" not in out and "passed" not in out, out[-3000:]
    assert "vLLM 0.33.0 is not installed: bash scripts/setup.sh --with-vllm" in out, out[-3000:]
