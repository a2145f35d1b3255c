"""Messages a user trips on: a required option left out, the serving user of a read-only image
layer, a miss on a host that cannot compile, an image layer that cannot be written, Ctrl-C and
an explicit ld.lld that is not there. Each is one clear line (or none), never a traceback."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cache_settings import settings_at
from mono_jit.cache import Store
from mono_jit.cli import main
from mono_jit.config import Settings
from mono_jit.errors import ToolchainError
from mono_jit.commands.doctor import LEAN_HOST
from mono_jit.pipeline.resolve import resolve
from mono_jit.spec import Spec
from mono_jit.pipeline.toolchain import find_linker
from read_only_mount import read_only_mount
from golden_pool import PREBUILD

REQUIRED = {name: [p for p in command.params if p.required] for name, command in main.commands.items()}


def test_the_commands_with_required_parameters_are_the_expected_ones():
    """The parametrised test below covers each; a new required option joins it by itself."""
    assert {n for n, params in REQUIRED.items() if params} == {"explain", "export", "import", "inspect", "pull",
                                                                "push"}


@pytest.mark.parametrize("name", sorted(n for n, params in REQUIRED.items() if params))
def test_a_command_without_its_required_parameters_is_a_usage_error(name, tmp_path):
    result = CliRunner().invoke(main, [name])
    assert result.exit_code == 2 and "Traceback" not in result.output, (result.output, result.exception)
    first = REQUIRED[name][0]
    what = f"option '{first.opts[0]}'" if first.param_type_name == "option" else f"argument '{first.human_readable_name}'"
    assert f"Error: Missing {what}." in result.output, result.output


# -- the serving user of a read-only image layer ----------------------------------------------

@pytest.fixture
def serving_user(warm_cache, tmp_path):
    """The image's serving user: the layer on MONO_JIT_CACHE_PATH, offline, no writable cache
    folder (a file where it would go), and no toolchain of its own (an ld.lld that is not there)."""
    layer = tmp_path / "opt-mono-jit"
    built = CliRunner().invoke(main, ["prebuild", "--template", "router,keytable", "--ratio", "4,128",
                                      "--max-tokens", "1", "--image-layer", str(layer), "--cache-dir", str(warm_cache)])
    assert built.exit_code == 0, built.output
    blocker = tmp_path / "home-is-a-file"
    blocker.write_text("")
    return {"MONO_JIT_CACHE_PATH": str(layer), "MONO_JIT_OFFLINE": "1", "MONO_JIT_CACHE_DIR": str(blocker / "cache"),
            "MONO_JIT_LD_LLD": str(tmp_path / "no-ld.lld")}


@pytest.mark.parametrize("command", [["list"], ["explain", "--template", "router"], ["prebuild", "--check",
                                     "--template", "router,keytable", "--max-tokens", "1"], ["stats"]],
                         ids=lambda c: c[0])
def test_a_serving_user_hit_says_nothing_about_what_it_does_not_need(serving_user, command):
    result = CliRunner().invoke(main, command, env=serving_user)
    assert result.exit_code == 0, result.output
    assert result.stderr == "", result.stderr  # no writable root needed, no toolchain needed for a hit


def test_explain_of_a_hit_under_a_recorded_toolchain_is_plain(serving_user):
    result = CliRunner().invoke(main, ["explain", "--template", "router", "--json"], env=serving_user)
    report = json.loads(result.stdout)
    assert report["status"] == "hit" and "none usable" not in report["toolchain"]
    assert report["toolchain"].startswith("recorded in the layers (1); this host has no toolchain of its own (")


# -- a miss on a host that cannot compile: where to build it ----------------------------------

def test_a_miss_without_a_toolchain_says_to_build_it_on_a_build_machine_and_ship_it(serving_user):
    settings = Settings({**serving_user, "MONO_JIT_OFFLINE": ""})
    with pytest.raises(ToolchainError) as missed:
        resolve("router", Spec(8, 4, 1024, 2), settings=settings)
    message = str(missed.value)
    assert "\n" not in message and "it cannot be compiled here" in message
    assert message.endswith("run mono-jit prebuild --template router --tp 8 --ratio 4 --max-model-len 1048576 "
                            "--max-tokens 2 --arch gfx950 on a build machine (FlyDSL and ld.lld, no GPU needed), then "
                            "ship the cache here: mono-jit export there and mono-jit import here, or an image layer "
                            "on MONO_JIT_CACHE_PATH"), message


def test_explain_on_a_lean_host_says_where_to_build_a_template_it_has_none_of(serving_user, monkeypatch):
    monkeypatch.setattr("mono_jit.api.cannot_compile_here", lambda: LEAN_HOST)
    result = CliRunner().invoke(main, ["explain", "--template", "k1"], env=serving_user)
    assert result.exit_code == 0, result.output
    assert ("no k1 entry at all; run mono-jit prebuild --template k1 --tp 8 --ratio 4 --max-model-len 1048576 "
            "--max-tokens 1 --arch gfx950 on a build machine") in result.stdout, result.stdout


# -- an image layer that cannot be written: said before anything compiles ---------------------

def test_an_image_layer_on_a_read_only_file_system_fails_before_compiling(tmp_path, monkeypatch):
    class NoCompile:
        def __init__(self, *args):
            raise AssertionError("a compile started before the image layer was checked")

    monkeypatch.setattr("mono_jit.pipeline.workers.WorkerPool", NoCompile)
    with read_only_mount(tmp_path / "ro", lambda mount: None) as mount:
        result = CliRunner().invoke(main, ["prebuild", "--template", "router", "--max-tokens", "1", "--ratio", "4",
                                           "--image-layer", str(mount / "opt-mono-jit"), "--cache-dir",
                                           str(tmp_path / "cache")])
    assert result.exit_code == 1, (result.output, result.exception)
    assert result.output == (f"mono-jit: error: cannot write the image layer {mount / 'opt-mono-jit'}: {mount}: "
                             "Read-only file system; give --image-layer a folder this user can write\n")


# -- Ctrl-C ------------------------------------------------------------------------------------

def test_ctrl_c_during_a_prebuild_says_what_was_kept_and_exits_130(golden_pool, tmp_path, monkeypatch):
    """The first compile is published, then the user presses Ctrl-C: exit 130, no 'Aborted!',
    the finished entry stays and nothing half-written is left in the cache."""
    import mono_jit.pipeline.workers

    class InterruptedPool(mono_jit.pipeline.workers.WorkerPool):  # the golden pool, interrupted at its second job
        def run(self, items):
            for done, outcome in enumerate(super().run(items)):
                if done == 1:
                    raise KeyboardInterrupt
                yield outcome

    monkeypatch.setattr("mono_jit.pipeline.workers.WorkerPool", InterruptedPool)
    cache = tmp_path / "fresh"
    result = CliRunner().invoke(main, [*PREBUILD, "--cache-dir", str(cache)])
    assert result.exit_code == 130, (result.output, result.exception)
    assert "Aborted" not in result.output and "Traceback" not in result.output
    assert result.stderr.endswith("mono-jit: interrupted: what finished is kept (each entry, bundle or layer entry "
                                  "is published whole, by one rename), nothing half-written; run the command again "
                                  "to go on\n"), result.stderr
    assert len(list(Store(settings_at(cache)).entries())) == 1
    assert not any((cache / "v1" / "tmp").iterdir())


def test_ctrl_c_during_an_export_leaves_no_partial_bundle(warm_cache, tmp_path, monkeypatch):
    def interrupted(path, *args, **kwargs):
        path.write_bytes(b"half a bundle")
        raise KeyboardInterrupt

    monkeypatch.setattr("mono_jit.cache.bundle.write_file", interrupted)
    result = CliRunner().invoke(main, ["export", str(tmp_path / "b.tar.gz"), "--cache-dir", str(warm_cache)])
    assert result.exit_code == 130 and "Aborted" not in result.output, result.output
    assert not (tmp_path / "b.tar.gz").exists() and not (tmp_path / "b.tar.gz.partial").exists()


# -- an explicit ld.lld that is not there -------------------------------------------------------

@pytest.mark.parametrize("what", ["missing", "a-folder"])
def test_an_ld_lld_setting_naming_no_file_names_the_path(tmp_path, what):
    path = tmp_path / what
    if what == "a-folder":
        path.mkdir()
    with pytest.raises(ToolchainError) as missing:
        find_linker(Settings({"MONO_JIT_LD_LLD": str(path)}))
    reason = "is not a file" if what == "a-folder" else "does not exist"
    assert f"(MONO_JIT_LD_LLD={path} {reason})" in str(missing.value) and "none found" not in str(missing.value)
