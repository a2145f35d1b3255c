"""scripts/build_warnings.py's scratch copy of the checkout leaves out the backend's output
folders at the top only: mono_jit/build (the build package) is source and must be copied."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "build_warnings.py"


def test_the_copy_keeps_a_package_named_build(tmp_path):
    spec = importlib.util.spec_from_file_location("build_warnings", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root = tmp_path / "checkout"
    for path in ("build/lib/x.py", "dist/x.whl", "pkg/build/job.py", "pkg/__pycache__/job.pyc", "pkg/dist/x.py"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("")
    shutil.copytree(root, tmp_path / "copy", ignore=module.skipped(root))
    kept = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*") if p.is_file())
    assert kept == ["pkg/build/job.py", "pkg/dist/x.py"]
