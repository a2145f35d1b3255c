"""`prebuild --image-layer`: the README's Dockerfile recipe without Docker. The build stage (root)
publishes a layer every user can read; the serving stage, another user with no writable cache
folder, serves every kernel from it offline."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

from click.testing import CliRunner

from mono_jit.cli import main

GRID = ["--template", "router,keytable", "--ratio", "4,128", "--max-tokens", "1"]

SERVE_AS_ANOTHER_USER = """
import json, os, sys
os.getuid = lambda: 65534  # the serving user: the layer's files belong to root, not to it
from mono_jit import Spec, resolve
hits = [not resolve(name, Spec(8, ratio, width, 1)).compiled
        for name in ("router", "keytable") for ratio, width in ((4, 1024), (128, 8192))]
print(json.dumps(hits))
"""


def test_the_build_stage_publishes_a_layer_any_user_can_read(warm_cache, tmp_path):
    layer = tmp_path / "opt-mono-jit"
    result = CliRunner().invoke(main, ["prebuild", *GRID, "--image-layer", str(layer), "--cache-dir",
                                       str(warm_cache), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["hits"] == 3 and summary["image_layer_added"] == 3
    for path in [layer, *layer.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert not path.is_symlink() and mode == (0o755 if path.is_dir() else 0o444), (path, oct(mode))
    assert len(list(layer.rglob("kernel.hsaco"))) == 3 and len(list(layer.rglob("toolchains/*.json"))) == 1
    again = CliRunner().invoke(main, ["prebuild", *GRID, "--image-layer", str(layer), "--cache-dir",
                                      str(warm_cache), "--json"])
    assert json.loads(again.output[again.output.index("{"):])["image_layer_added"] == 0


def test_the_serving_stage_reads_it_offline_with_no_writable_folder(warm_cache, tmp_path):
    layer = tmp_path / "opt-mono-jit"
    built = CliRunner().invoke(main, ["prebuild", *GRID, "--image-layer", str(layer), "--cache-dir",
                                      str(warm_cache)])
    assert built.exit_code == 0, built.output
    blocker = tmp_path / "home-is-a-file"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONO_JIT_")}
    env.update(MONO_JIT_CACHE_PATH=str(layer), MONO_JIT_OFFLINE="1", MONO_JIT_CACHE_DIR=str(blocker / "cache"),
               HOME=str(blocker))
    out = subprocess.run([sys.executable, "-c", SERVE_AS_ANOTHER_USER], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == [True] * 4
    assert not (blocker.parent / "cache").exists() and blocker.is_file()
