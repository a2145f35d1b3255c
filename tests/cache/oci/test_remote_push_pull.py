"""`mono-jit push` / `mono-jit pull` against a real registry (Debian's docker-registry on
127.0.0.1, behind a counting proxy): push from one cache, pull into an empty one, a second pull
and push move nothing, pulls into an image layer, pinned digests, and one-line refusals."""

from __future__ import annotations

import json
import os
import stat

from cache_settings import SMALL_SPECS, settings_at
from click.testing import CliRunner
from oci_registry import new_ref, oci_proxy, oci_registry  # noqa: F401  (fixtures)

from mono_jit.cache import Store
from mono_jit.cache.oci.artifact import CONFIG_BYTES, build_manifest, digest_of
from mono_jit.cache.oci.client import Registry
from mono_jit.cache.oci.reference import parse_reference
from mono_jit.cli import main
from mono_jit.pipeline.resolve import resolve_many


def cli(*args: str) -> tuple[int, dict | str]:
    result = CliRunner().invoke(main, list(args))
    if "--json" in args and result.exit_code == 0:
        return result.exit_code, json.loads(result.stdout)
    return result.exit_code, result.output


def entries(root) -> dict[str, bytes]:
    return {e.key: e.hsaco for e in Store(settings_at(root)).served()}


def test_push_then_pull_into_an_empty_cache(warm_cache, tmp_path, oci_proxy):
    ref = new_ref(oci_proxy)
    code, pushed = cli("push", ref, "--insecure", "--cache-dir", str(warm_cache), "--json")
    assert code == 0, pushed
    assert pushed["schema"] == "mono-jit-push/1" and pushed["added"] == pushed["uploaded"] == pushed["listed"] == 3
    oci_proxy.reset()
    empty = tmp_path / "empty"
    code, pulled = cli("pull", ref, "--insecure", "--cache-dir", str(empty), "--json")
    assert code == 0, pulled
    assert pulled["schema"] == "mono-jit-pull/1" and pulled["fetched"] == 3 and pulled["present"] == 0
    assert dict(oci_proxy.counts) == {"GET manifest": 1, "GET blob": 3}  # one request a missing entry
    assert entries(empty) == entries(warm_cache)
    assert not list((empty / "v1" / "tmp").iterdir())


def test_a_second_pull_and_a_second_push_move_nothing(warm_cache, tmp_path, oci_proxy):
    ref = new_ref(oci_proxy)
    assert cli("push", ref, "--insecure", "--cache-dir", str(warm_cache))[0] == 0
    assert cli("pull", ref, "--insecure", "--cache-dir", str(tmp_path / "b"))[0] == 0
    oci_proxy.reset()
    code, again = cli("pull", ref, "--insecure", "--cache-dir", str(tmp_path / "b"), "--json")
    assert code == 0 and again["fetched"] == 0 and again["bytes"] == 0 and again["present"] == 3
    code, pushed = cli("push", ref, "--insecure", "--cache-dir", str(warm_cache), "--json")
    assert code == 0 and pushed["uploaded"] == 0 and pushed["bytes"] == 0 and not pushed["manifest_written"]
    assert dict(oci_proxy.counts) == {"GET manifest": 2}  # one manifest read each, nothing else


def test_a_pull_finds_entries_in_read_only_layers_too(warm_cache, tmp_path, oci_proxy, monkeypatch):
    ref = new_ref(oci_proxy)
    assert cli("push", ref, "--insecure", "--cache-dir", str(warm_cache))[0] == 0
    monkeypatch.setenv("MONO_JIT_CACHE_PATH", str(warm_cache))
    code, pulled = cli("pull", ref, "--insecure", "--cache-dir", str(tmp_path / "rw"), "--json")
    assert code == 0 and pulled["fetched"] == 0 and pulled["present"] == 3


def test_push_adds_to_what_the_reference_lists_unless_replacing(warm_cache, tmp_path, oci_proxy):
    ref = new_ref(oci_proxy)
    assert cli("push", ref, "--insecure", "--template", "router", "--cache-dir", str(warm_cache))[0] == 0
    code, report = cli("push", ref, "--insecure", "--template", "keytable", "--cache-dir", str(warm_cache), "--json")
    assert code == 0 and report["added"] == 2 and report["listed"] == 3
    code, report = cli("push", ref, "--insecure", "--replace", "--template", "router", "--cache-dir",
                       str(warm_cache), "--json")
    assert code == 0 and report["listed"] == 1 and report["uploaded"] == 0  # the blob is there already
    code, pulled = cli("pull", ref, "--insecure", "--cache-dir", str(tmp_path / "c"), "--json")
    assert code == 0 and pulled["fetched"] == 1


def test_pull_into_an_image_layer_serves_offline(warm_cache, tmp_path, oci_proxy):
    ref = new_ref(oci_proxy)
    assert cli("push", ref, "--insecure", "--cache-dir", str(warm_cache))[0] == 0
    layer = tmp_path / "opt-mono-jit"
    code, pulled = cli("pull", ref, "--insecure", "--image-layer", str(layer), "--cache-dir",
                       str(tmp_path / "unused"), "--json")
    assert code == 0 and pulled["fetched"] == 3 and pulled["target"] == str(layer)
    assert not (tmp_path / "unused").exists()  # the image layer is the only thing written
    for path in [layer, *layer.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o444), (path, oct(mode))
    settings = settings_at(tmp_path / "serve", MONO_JIT_CACHE_PATH=str(layer), MONO_JIT_OFFLINE="1")
    resolved = resolve_many([(name, spec) for name in ("router", "keytable") for spec in SMALL_SPECS],
                            settings=settings)
    assert not any(r.compiled for r in resolved) and all(r.entry.layer.root == layer for r in resolved)
    code, again = cli("pull", ref, "--insecure", "--image-layer", str(layer), "--json")
    assert code == 0 and again["fetched"] == 0 and again["present"] == 3


def test_a_pinned_digest_is_checked(warm_cache, tmp_path, oci_proxy):
    ref = new_ref(oci_proxy)
    code, pushed = cli("push", ref, "--insecure", "--cache-dir", str(warm_cache), "--json")
    assert code == 0
    pinned = ref.rsplit(":", 1)[0] + "@" + pushed["manifest_digest"]
    code, pulled = cli("pull", pinned, "--insecure", "--cache-dir", str(tmp_path / "d"), "--json")
    assert code == 0 and pulled["fetched"] == 3
    wrong = ref.rsplit(":", 1)[0] + "@sha256:" + "0" * 64
    code, output = cli("pull", wrong, "--insecure", "--cache-dir", str(tmp_path / "e"))
    assert code == 1 and output.count("\n") == 1 and "error:" in output, output


def test_bad_references_and_plain_http_are_refused_in_one_line(warm_cache, oci_proxy):
    code, output = cli("push", "team/mono-jit:x", "--cache-dir", str(warm_cache))
    assert code == 2 and "is not a registry host" in output
    code, output = cli("pull", new_ref(oci_proxy), "--cache-dir", str(warm_cache))  # HTTPS to a plain-HTTP registry
    assert code == 1 and output.count("\n") == 1 and "MONO_JIT_REMOTE_INSECURE" in output, output
    code, output = cli("pull", new_ref(oci_proxy), "--insecure", "--cache-dir", str(warm_cache))
    assert code == 1 and output.count("\n") == 1 and "names nothing in the registry" in output, output


def test_another_artifact_at_the_reference_is_neither_pulled_nor_overwritten(warm_cache, tmp_path, oci_proxy):
    ref = parse_reference(new_ref(oci_proxy))
    registry = Registry(ref, insecure=True)
    registry.upload(CONFIG_BYTES, digest_of(CONFIG_BYTES), "application/vnd.oci.image.config.v1+json")
    manifest = build_manifest([], {})
    manifest["config"]["mediaType"] = "application/vnd.oci.image.config.v1+json"
    registry.put_manifest(manifest)
    for command in ("pull", "push"):
        code, output = cli(command, str(ref), "--insecure", "--cache-dir", str(warm_cache))
        assert code == 1 and "is not a mono-jit cache" in output and output.count("\n") == 1, output
    assert os.listdir(warm_cache / "v1" / "tmp") == []


def test_references_parse_or_say_what_was_expected():
    import pytest

    from mono_jit.config import Settings
    from mono_jit.errors import MonoJitError

    ref = parse_reference("registry.example:5000/team/mono-jit:dsv4-pro-tp8")
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == ("registry.example:5000", "team/mono-jit",
                                                                   "dsv4-pro-tp8", None)
    assert parse_reference("registry.example/team/cache").tag == "latest"
    pinned = parse_reference("localhost:5000/c@sha256:" + "a" * 64)
    assert pinned.digest == "sha256:" + "a" * 64 and str(pinned) == "localhost:5000/c@sha256:" + "a" * 64
    for bad, says in (("team/cache:x", "not a registry host"), ("registry.example", "names no repository"),
                      ("registry.example/Team/cache", "lowercase"), ("registry.example/c:bad tag", "not a valid tag"),
                      ("registry.example/c@sha256:12", "not sha256")):
        with pytest.raises(ValueError, match=says):
            parse_reference(bad)
    with pytest.raises(MonoJitError, match="MONO_JIT_REMOTE='team/cache'"):
        Settings({"MONO_JIT_REMOTE": "team/cache"})
    settings = Settings({"MONO_JIT_REMOTE_INSECURE": "127.0.0.1:5000, registry.lan"})
    assert settings.remote_insecure == ("127.0.0.1:5000", "registry.lan") and settings.remote is None
