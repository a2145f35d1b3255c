"""The operator's side of the CLI: -v / -q, verify --rebuild progress,
explain on corrupt entries and the kinds of miss, unreadable roots in one line, one vocabulary
(template errors, --max-model-len, JSON schemas, no Python reprs)."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from cache_settings import settings_at
from mono_jit.cache import Entry, EntryMeta, Store, cache_key
from mono_jit.cli import main
from mono_jit.errors import OfflineMiss
from mono_jit.pipeline.resolve import resolve
from mono_jit.spec import Spec


def invoke(root, *args, code=0, env=None):
    result = CliRunner().invoke(main, [*args, "--cache-dir", str(root)] if root else list(args), env=env)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == code, result.output
    return result


def router_entry(root) -> Entry:
    return next(e for e in Store(settings_at(root)).entries() if isinstance(e, Entry) and e.meta.template == "router")


def flip_hsaco_byte(entry: Entry) -> None:
    path = entry.path / "kernel.hsaco"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


# -- -v / -q and progress (item 5) -----------------------------------------------------------

def test_quiet_drops_progress_notes_totals_and_warnings_but_not_data(warm_cache, golden_pool):
    flip_hsaco_byte(router_entry(warm_cache))  # prebuild's lookup quarantines it, with a warning
    loud = invoke(warm_cache, "prebuild", "--template", "keytable", "--ratio", "4", "--max-tokens", "1")
    assert "[1/1] hit keytable(" in loud.stderr and "1 builds: 0 compiled, 1 hits" in loud.stdout
    quiet = invoke(warm_cache, "-q", "prebuild", "--template", "router", "--ratio", "4", "--max-tokens", "1")
    assert quiet.stdout == "" and "quarantined" not in quiet.stderr and "[1/1]" not in quiet.stderr, quiet.output
    listed = invoke(warm_cache, "-q", "list").stdout.splitlines()
    assert len(listed) == 3 and not any("entries;" in line for line in listed)  # rows, no totals


def test_verbose_logs_cache_decisions_and_times_each_job(warm_cache, golden_pool):
    flip_hsaco_byte(router_entry(warm_cache))
    out = invoke(warm_cache, "-v", "prebuild", "--template", "router", "--ratio", "4", "--max-tokens", "1")
    assert f"mono-jit: cache layers: {warm_cache} (writable)" in out.stderr, out.stderr
    assert "mono-jit: quarantined bad cache entry" in out.stderr, out.stderr
    assert any(line.startswith("[1/1] compiled router(max_tokens=1") and line.endswith("s")
               for line in out.stderr.splitlines()), out.stderr
    assert "cache layers" not in invoke(warm_cache, "prebuild", "--template", "router", "--ratio", "4",
                                        "--max-tokens", "1").stderr
    invoke(warm_cache, "-v", "-q", "list", code=2)


def test_verify_rebuild_reports_each_finished_job_off_a_terminal(warm_cache, golden_pool):
    out = invoke(warm_cache, "verify", "--rebuild")
    lines = [line for line in out.stderr.splitlines() if line.startswith("[")]
    assert len(lines) == 3 and all(" identical " in line for line in lines), out.stderr
    assert lines[-1].startswith("[3/3] identical ") and "3 good, 0 bad" in out.stdout


# -- explain and the kinds of miss (item 6) --------------------------------------------------

def test_explain_on_a_corrupt_entry_says_corrupt_and_writes_nothing(warm_cache):
    entry = router_entry(warm_cache)
    flip_hsaco_byte(entry)
    report = json.loads(invoke(warm_cache, "explain", "--template", "router", "--json").stdout)
    assert report["status"] == "corrupt" and "sha256" in report["reason"] and report["path"] == str(entry.path)
    text = invoke(warm_cache, "explain", "--template", "router").stdout
    assert text.startswith("corrupt: router(max_tokens=1, arch=gfx950): the entry at ") and "differs in" not in text, text
    assert entry.path.is_dir()  # explain quarantines nothing


def _rebuilt_by_another_toolchain(root) -> Entry:
    """The router entry republished as if another ld.lld had built it (a valid entry, other key)."""
    store = Store(settings_at(root))
    entry = router_entry(root)
    meta = json.loads((entry.path / "meta.json").read_text())
    meta["factors"]["toolchain"]["ld_lld"] = "LLD 99.0.0"
    meta["key"] = cache_key(meta["factors"])
    store.remove(entry.path)
    return store.publish(meta["key"], "gfx950", entry.hsaco, EntryMeta.from_json(meta))


@pytest.mark.parametrize("case, kind", [("absent", "not in any layer"), ("toolchain", "built by another toolchain"),
                                        ("flipped", "unreadable")])
def test_an_offline_miss_says_which_kind_of_miss(warm_cache, case, kind):
    if case == "absent":
        spec = Spec(8, 4, 1024, 2)
    else:
        spec = Spec(8, 4, 1024, 1)
        if case == "toolchain":
            _rebuilt_by_another_toolchain(warm_cache)
        else:
            flip_hsaco_byte(router_entry(warm_cache))
    # Another toolchain's entry of the same build serves unless the exact toolchain is asked for.
    exact = {"MONO_JIT_EXACT_TOOLCHAIN": "1"} if case == "toolchain" else {}
    with pytest.raises(OfflineMiss) as info:
        resolve("router", spec, settings=settings_at(warm_cache, MONO_JIT_OFFLINE="1", **exact))
    text = str(info.value)
    assert f"): {kind}: " in text and "\n" not in text and "fill it with: mono-jit prebuild" in text, text
    if case == "toolchain":
        assert "toolchain.ld_lld" in text and "MONO_JIT_EXACT_TOOLCHAIN=1 refuses it" in text
    if case == "flipped":
        assert "sha256" in text
    explained = json.loads(invoke(warm_cache, "explain", "--template", "router", "--max-tokens",
                                  str(spec.max_tokens), "--json", env=exact).stdout)
    assert explained["status"] == ("corrupt" if case == "flipped" else "miss")
    if case != "flipped":
        assert explained["miss_kind"] == kind


# -- unreadable roots and paths: one line (item 7) -------------------------------------------

COMMANDS = [("list",), ("verify",), ("stats",), ("doctor",), ("explain", "--template", "router"),
            ("gc", "--dry-run"), ("inspect", "0000")]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_read_only_root_that_is_a_file_is_named_once_and_skipped(warm_cache, tmp_path, command):
    afile = tmp_path / "layer-file"
    afile.write_text("")
    result = CliRunner().invoke(main, [*command, "--cache-dir", str(warm_cache)],
                                env={"MONO_JIT_CACHE_PATH": str(afile)})
    assert "Traceback" not in result.output and result.exit_code in (0, 1), result.output
    assert result.output.count(f"read-only cache root {afile} (MONO_JIT_CACHE_PATH) is not a folder") == 1, \
        result.output


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_an_unlistable_root_is_named_once_and_skipped(warm_cache, tmp_path, monkeypatch, command):
    layer = tmp_path / "layer"
    (layer / "v1").mkdir(parents=True, mode=0o755)
    os.chmod(layer, 0o755)
    real = os.listdir

    def listdir(path="."):
        if os.fspath(path) == str(layer / "v1"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(os, "listdir", listdir)
    result = CliRunner().invoke(main, [*command, "--cache-dir", str(warm_cache)],
                                env={"MONO_JIT_CACHE_PATH": str(layer)})
    assert "Traceback" not in result.output and result.exit_code in (0, 1), result.output
    assert result.output.count(f"cannot read cache layer {layer}: Permission denied; skipping it") == 1, \
        result.output


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_writable_root_that_cannot_be_made_is_information_said_once_with_v(tmp_path, command):
    """A serving user of a read-only image layer has no writable root and needs none: nothing is
    said by default; -v says it once (a write that needs the root fails with its own error)."""
    for verbose in ([], ["-v"]):
        root = tmp_path / f"afile{len(verbose)}" / "cache"  # a new path a run: each message is said once a process
        root.parent.write_text("")
        result = CliRunner().invoke(main, [*verbose, *command, "--cache-dir", str(root)])
        assert "Traceback" not in result.output and result.exit_code in (0, 1), result.output
        said = result.output.count(f"cannot create the writable cache root {root} (Not a directory)")
        assert said == len(verbose), result.output
        assert all(line.startswith("mono-jit: ") for line in result.stderr.splitlines()), result.stderr


def test_a_bundle_into_a_missing_folder_names_the_folder(warm_cache, tmp_path):
    target = tmp_path / "missing" / "b.tar"
    out = invoke(warm_cache, "export", str(target), code=1).output
    assert out == f"mono-jit: error: {target}: expected a file in an existing folder; {target.parent} is not one\n"


# -- one vocabulary (item 8) -----------------------------------------------------------------

@pytest.mark.parametrize("command", [("prebuild",), ("list",), ("explain",), ("export", "b.tar")],
                         ids=lambda c: c[0])
def test_an_unknown_template_is_the_same_usage_error_everywhere(warm_cache, command):
    out = invoke(warm_cache, *command, "--template", "router,nope", code=2).output
    assert "Error: Invalid value for --template: 'nope' is not a registered template; known: " in out, out


def test_explain_takes_prebuilds_max_model_len_and_keeps_topk_width_hidden(warm_cache):
    by_len = json.loads(invoke(warm_cache, "explain", "--template", "keytable", "--ratio", "128",
                               "--max-model-len", str(1 << 20), "--json").stdout)
    by_width = json.loads(invoke(warm_cache, "explain", "--template", "keytable", "--ratio", "128",
                                 "--topk-width", "8192", "--json").stdout)
    assert by_len["status"] == by_width["status"] == "hit" and by_len["key"] == by_width["key"]
    short = json.loads(invoke(warm_cache, "explain", "--template", "keytable", "--ratio", "128",
                              "--max-model-len", "262144", "--json").stdout)
    assert short["status"] == "miss" and {"factor": "spec.topk_width", "wanted": 2048, "stored": 8192} \
        in short["differences"]
    helptext = invoke(None, "explain", "--help").output
    assert "--max-model-len" in helptext and "--topk-width" not in helptext


def test_every_json_output_is_an_object_with_its_schema(warm_cache, tmp_path):
    key = router_entry(warm_cache).key
    bundle = tmp_path / "b.tar"
    runs = {
        "prebuild": ("prebuild", "--template", "router", "--ratio", "4", "--max-tokens", "1"),
        "list": ("list",), "inspect": ("inspect", key[:8]), "explain": ("explain", "--template", "router"),
        "verify": ("verify",), "gc": ("gc", "--dry-run"), "export": ("export", str(bundle)),
        "import": ("import", str(bundle)), "doctor": ("doctor",), "stats": ("stats",),
        "clear": ("clear", "--yes"),
    }
    for kind, args in runs.items():
        data = json.loads(invoke(warm_cache, *args, "--json").stdout)
        assert data["schema"] == f"mono-jit-{kind}/1", (kind, data)
    assert json.loads(invoke(None, "config", "--json").stdout)["schema"] == "mono-jit-config/1"


def test_rows_keep_one_shape_and_one_type_per_field(warm_cache):
    flip_hsaco_byte(router_entry(warm_cache))
    rows = json.loads(invoke(warm_cache, "verify", "--json", code=1).stdout)["entries"]
    assert len({tuple(sorted(r)) for r in rows}) == 1 and {r["ok"] for r in rows} == {True, False}
    invoke(warm_cache, "prebuild", "--template", "keytable", "--ratio", "4", "--max-tokens", "1")
    listed = json.loads(invoke(warm_cache, "list", "--json").stdout)["entries"]
    shapes = {tuple(sorted((k, type(v).__name__) for k, v in row.items())) for row in listed}
    assert len(shapes) == 1, shapes


def test_text_output_has_no_python_reprs(warm_cache, tmp_path):
    key = router_entry(warm_cache).key
    texts = [invoke(warm_cache, *args).stdout for args in
             (("inspect", key[:8]), ("explain", "--template", "router", "--max-tokens", "2"), ("list",), ("stats",),
              ("doctor",))]
    texts.append(invoke(None, "config", env={"MONO_JIT_CACHE_PATH": str(tmp_path)}).stdout)
    for text in texts:
        for repr_mark in ("{'", "['", "PosixPath(", "None", "True", "False", "(256, "):
            assert repr_mark not in text, (repr_mark, text)
