"""`prebuild --image-layer DIR` into a folder that exists: the modes of what this run did not
create stay as they are; a shared (sticky or others-writable) folder, another user's folder
(also through a symlink) or one other users cannot enter is refused, naming it and why, before
anything compiles and leaving nothing there; the finished layer is checked under the trust
rules it will be read with before success is reported."""

from __future__ import annotations

import json
import os
import stat

import pytest
from click.testing import CliRunner

from mono_jit.cli import main

GRID = ["--template", "router,keytable", "--ratio", "4,128", "--max-tokens", "1"]
OTHER_UID = 65534


class NoCompile:
    def __init__(self, *args):
        raise AssertionError("a compile started before the image layer was checked")


def prebuild(layer, cache):
    result = CliRunner().invoke(main, ["prebuild", *GRID, "--image-layer", str(layer), "--cache-dir", str(cache)])
    assert "Traceback" not in result.output, result.output
    return result


def folder(path, mode, uid=None):
    path.mkdir()
    os.chmod(path, mode)
    if uid is not None:
        os.chown(path, uid, -1)
    return path


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.skipif(os.getuid() != 0, reason="makes folders of another user (needs root, as a docker build is)")
@pytest.mark.parametrize("case, why", [
    ("sticky", "is a shared folder (sticky"),
    ("others-writable", "is writable by other users (mode 777)"),
    ("link-to-another-users-777", "is writable by other users (mode 777)"),
    ("link-to-another-users-755", f"is owned by uid {OTHER_UID}"),
    ("unreadable", "cannot be entered by other users (mode 700)"),
])
def test_an_existing_destination_that_is_not_the_builders_own_is_refused(case, why, tmp_path, monkeypatch):
    monkeypatch.setattr("mono_jit.pipeline.workers.WorkerPool", NoCompile)
    target = {"sticky": lambda p: folder(p, 0o1777),
              "others-writable": lambda p: folder(p, 0o777),
              "link-to-another-users-777": lambda p: folder(p, 0o777, OTHER_UID),
              "link-to-another-users-755": lambda p: folder(p, 0o755, OTHER_UID),
              "unreadable": lambda p: folder(p, 0o700)}[case](tmp_path / "shared")
    layer = target
    if case.startswith("link"):
        layer = tmp_path / "layer"
        layer.symlink_to(target)
    before = mode(target)
    result = prebuild(layer, tmp_path / "cache")
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"mono-jit: error: image layer refused: {layer}") and why in result.output, \
        result.output
    assert mode(target) == before and os.listdir(target) == []  # nothing re-moded, nothing left behind
    assert not (tmp_path / "cache").exists()  # refused before anything compiled or was written


def test_an_existing_folder_of_the_builders_own_keeps_its_mode(warm_cache, tmp_path):
    layer = folder(tmp_path / "opt-mono-jit", 0o751)
    result = prebuild(layer, warm_cache)
    assert result.exit_code == 0, result.output
    assert mode(layer) == 0o751 and mode(layer / "v1") == 0o755  # v1 is this run's: made 0755
    assert len(list(layer.rglob("kernel.hsaco"))) == 3


def test_a_finished_layer_the_trust_rules_refuse_is_not_reported_a_success(warm_cache, tmp_path):
    """An arch folder others can write, left in the layer: a serving user would skip it all."""
    layer = folder(tmp_path / "opt-mono-jit", 0o755)
    folder(layer / "v1", 0o755)
    folder(layer / "v1" / "gfx950", 0o775)
    result = prebuild(layer, warm_cache)
    assert result.exit_code == 1 and "entries added" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("mono-jit: error:")]
    assert len(errors) == 1 and str(layer / "v1" / "gfx950") in errors[0], result.output
    assert "would be refused where it is served" in errors[0] and "group/world-writable" in errors[0], errors
    assert mode(layer / "v1" / "gfx950") == 0o775
