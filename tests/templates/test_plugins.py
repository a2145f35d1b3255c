"""The template plug-in contract (docs/plugins.md) where an author trips: every template comes
from a `mono_jit.templates` entry point, the class is checked when it registers, its answers
before compiling and its kernargs after, and a broken plug-in fails alone, by name."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cache_settings import SMALL_SPECS, settings_at
from click.testing import CliRunner

from mono_jit.pipeline.job import BuildJob
from mono_jit.cache import Store
from mono_jit.config import Settings
from mono_jit.pipeline.deployment import default_templates
from mono_jit.errors import CompileError, MonoJitError, TemplateError
from mono_jit.pipeline.prebuild import plan, prebuild
from mono_jit.pipeline.deployment import LAYER_TEMPLATES
from mono_jit.spec import Spec
from mono_jit.templates import discovery, get, names, problems, register, registry
from mono_jit.templates.base import PACKAGE_DIR
from mono_jit.pipeline.toolchain import compile_environment, resolve_toolchain
from mono_jit.pipeline.workers import Outcome

FP = {"flydsl": "0.5.0", "record": "r", "ld_lld": "22.1.8", "bitcode": "b"}
SPEC = Spec(8, 4, 1024, 1)

CLASS = '''
from mono_jit.templates import Argument, LaunchShape, Template


class Plug(Template):
    name = {name!r}
    spec_fields = {fields!r}
    source_files = {files!r}
    kernel_module = {kernel!r}

    def launch_shape(self, spec):
        return LaunchShape(grid={grid}, block=(64, 1, 1))

    def arguments(self, spec):
        return (Argument("x", "tensor", {dtype!r}, "in"), Argument("m", "i32", "int32", "rows"))
'''


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """install(package, **class fields): a plug-in package in tmp_path, declared by an entry
    point beside the real declarations; the registry is restored afterwards."""
    for attr in ("_registry", "_added", "_failed"):  # as in a fresh process: nothing loaded yet
        monkeypatch.setattr(registry, attr, {})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # files rewritten within a second stay fresh
    extra: list[discovery.Declaration] = []
    real = discovery.declarations
    monkeypatch.setattr(registry, "declarations", lambda: real() + tuple(extra))

    def install(package: str, name: str | None = None, *, declared_as: str | None = None, init: str | None = None,
                **fields: object) -> Path:
        folder = tmp_path / package
        folder.mkdir()
        values = {"name": name or package, "fields": ("max_tokens",), "files": ("__init__.py", "kernel.py"),
                  "kernel": ".kernel", "grid": "(spec.max_tokens, 1, 1)", "dtype": "float32", **fields}
        (folder / "__init__.py").write_text(init if init is not None else CLASS.format(**values))
        (folder / "kernel.py").write_text("def build(spec):\n    raise NotImplementedError\n")
        extra.append(discovery.Declaration(declared_as or values["name"], f"{package}:Plug", f"dist-{package}"))
        return folder

    yield install
    for module in [m for m in sys.modules if m.startswith("plug_")]:
        del sys.modules[module]


# --- discovery and the registry --------------------------------------------------------------


def test_declarations_come_from_entry_points_txt_and_the_first_distribution_wins(tmp_path, monkeypatch):
    for folder, value in (("one", "first:A"), ("two", "second:B")):
        meta = tmp_path / folder / "acme_kernels-1.0.dist-info"
        meta.mkdir(parents=True)
        (meta / "entry_points.txt").write_text(
            f"[console_scripts]\nvadd = not:this\n\n[mono_jit.templates]\n# a comment\nvadd = {value} [extra]\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "one"), str(tmp_path / "two")])
    (found,) = discovery.declarations()
    assert (found.name, found.distribution, found.target()) == ("vadd", "acme-kernels", ("first", "A"))


def test_unreadable_or_undecodable_metadata_declares_nothing_and_breaks_nothing(tmp_path, monkeypatch):
    """A distribution's entry_points.txt that is a folder, or holds bytes that are not UTF-8, is
    read as far as it can be; the other distributions' declarations stand."""
    broken = tmp_path / "broken_dist-1.0.dist-info" / "entry_points.txt"
    broken.mkdir(parents=True)
    latin = tmp_path / "latin_dist-1.0.dist-info"
    latin.mkdir()
    (latin / "entry_points.txt").write_bytes(b"[mono_jit.templates]\n# caf\xe9\nvadd = latin:V\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    (found,) = discovery.declarations()
    assert (found.name, found.distribution, found.value) == ("vadd", "latin-dist", "latin:V")


def test_the_built_ins_are_declared_by_mono_jits_entry_points():
    ours = {d.name: d for d in discovery.declarations() if d.distribution == "mono-jit"}
    assert {"k1", "k2", "router", "keytable"} <= set(ours)
    assert ours["router"].value == "mono_jit.templates.router:RouterTemplate"


def test_the_registry_imports_no_template_package_and_no_template_imports_the_registry():
    tree = ast.parse((PACKAGE_DIR / "templates" / "registry.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "errors", None, "base", "discovery"}, imported
    assert "BUILTINS" not in (PACKAGE_DIR / "templates" / "registry.py").read_text()
    packages = sorted((PACKAGE_DIR / "templates").glob("*/__init__.py"))
    assert len(packages) >= 4  # k1, k2, keytable, router
    for init in packages:
        source = init.read_text()
        assert "registry" not in source and "@register" not in source, init


def test_get_imports_only_the_template_asked_for():
    code = ("import json, sys; from mono_jit.templates import get; get('router'); "
            "print(json.dumps([m for m in sys.modules if m.startswith('mono_jit.templates.')]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert "mono_jit.templates.router" in loaded
    assert not loaded & {"mono_jit.templates.k1", "mono_jit.templates.keytable", "mono_jit.templates.router.kernel"}


def test_a_plugins_source_files_and_kernel_module_are_its_own(plugins):
    folder = plugins("plug_own")
    template = get("plug_own")
    assert template.source_root() == folder.resolve()
    assert template.kernel_module_name() == "plug_own.kernel"
    before = template.source_digest()
    with pytest.raises(NotImplementedError):  # its own kernel module, not mono_jit.templates.kernel
        template.build(SPEC)
    (folder / "kernel.py").write_text("def build(spec):\n    return None  # edited\n")
    assert template.source_digest() != before  # the plug-in's own file is in its key
    assert get("k1").source_root() == PACKAGE_DIR  # the built-ins' files stay relative to mono_jit/
    assert get("k1").kernel_module_name() == "mono_jit.templates.k1.kernel"


def test_a_plugins_key_follows_its_imports_and_the_files_it_lists(plugins):
    derived = plugins("plug_derived", files=None)
    (derived / "tiles.py").write_text("ROWS = 4\n")
    (derived / "kernel.py").write_text("from .tiles import ROWS\n\n\ndef build(spec):\n    return ROWS\n")
    template = get("plug_derived")
    assert list(template.sources()) == ["__init__.py", "kernel.py", "tiles.py"]  # no list kept by hand
    before = template.source_digest()
    (derived / "tiles.py").write_text("ROWS = 8\n")
    assert template.source_digest() != before
    listed = plugins("plug_listed", files=("tiles.json",))
    (listed / "tiles.json").write_text("[4]")
    template = get("plug_listed")
    assert list(template.sources()) == ["__init__.py", "kernel.py", "tiles.json"]  # its imports, and the list
    before = template.source_digest()
    (listed / "tiles.json").write_text("[8]")
    assert template.source_digest() != before


@pytest.mark.parametrize(("fields", "expected"), [
    ({"fields": ("max_token",)}, "spec_fields names 'max_token', which is not a Spec field"),
    ({"fields": "max_tokens"}, "spec_fields='max_tokens': expected a tuple of strings"),
    ({"files": ("__init__.py", "kernels.py")}, "source file 'kernels.py' is not a file in"),
    ({"files": ("../mono_jit/spec.py",)}, "expected a path inside"),
    ({"files": ("__init__.py", "./sub/../../x.py")}, "expected a path inside"),
    ({"files": ("/etc/passwd",)}, "expected a path inside"),
    ({"files": ("",)}, "expected a path inside"),
    ({"files": ()}, "source_files is empty"),
    ({"kernel": ".kernels"}, "kernel_module '.kernels': no module plug_bad.kernels"),
])
def test_a_class_breaking_the_contract_fails_at_registration_by_name(plugins, fields, expected):
    plugins("plug_bad", **fields)
    with pytest.raises(TemplateError, match="template 'plug_bad' \\(dist-plug_bad \\(plug_bad:Plug\\)\\)") as err:
        get("plug_bad")
    assert expected in str(err.value)
    assert expected in problems()["plug_bad"]
    assert "router" in registry.all_templates()  # the others stay usable


def test_the_entry_point_name_is_the_class_name(plugins):
    plugins("plug_named", name="vadd", declared_as="plug_named")
    with pytest.raises(TemplateError, match="the class's name is 'vadd'; it must be the entry point's name"):
        get("plug_named")


def test_a_plugin_that_fails_to_import_fails_alone(plugins):
    plugins("plug_broken", init="import no_such_module_here\n")
    with pytest.raises(TemplateError, match="plug_broken.*failed to load: ModuleNotFoundError"):
        get("plug_broken")
    assert "plug_broken" not in registry.all_templates() and "k1" in registry.all_templates()


def test_a_name_taken_twice_or_a_built_ins_name_names_both_sources(plugins):
    plugins("plug_k1", name="k1")
    with pytest.raises(TemplateError) as err:
        get("k1")
    assert str(err.value) == ("template 'k1' is declared twice: by mono-jit (mono_jit.templates.k1:K1Template) "
                              "and by dist-plug_k1 (plug_k1:Plug); uninstall one of them")
    assert get("router").name == "router"


def test_register_refuses_a_declared_name(plugins):
    class Shadow(type(get("router"))):
        pass

    with pytest.raises(TemplateError, match="'router' is declared twice: by mono-jit .* and by test_plugins:"):
        register(Shadow)
    with pytest.raises(TemplateError, match="declared by the entry point mono-jit .*: drop the register\\(\\) call"):
        register(type(get("router")))  # the old decorator in a built-in package


# --- before compiling: the template's answers for a spec --------------------------------------


@pytest.mark.parametrize(("grid", "expected"), [
    ("(spec.max_tokens / 1, 1, 1)", "grid.x=1.0 (float) is not a constant"),
    ("(None, 1, 1)", "grid.x=None (NoneType) is not a constant"),
    ("(spec.max_tokens, 1)", "expected a tuple of three integers"),
    ("(0, 1, 1)", "grid.x=0: expected 1 to"),
])
def test_a_launch_shape_that_is_not_constant_fails_before_compiling(plugins, monkeypatch, grid, expected):
    plugins("plug_grid", grid=grid)
    monkeypatch.setattr("mono_jit.pipeline.workers.WorkerPool", None)  # nothing may start a compile
    summary, planned = prebuild([get("plug_grid")], [SPEC], Settings(), jobs=1, timeout=60)
    assert planned == [] and summary.compiled == 0
    (failure,) = summary.failed
    assert failure["key"] is None and failure["template"] == "plug_grid"
    assert failure["error"].startswith("plug_grid(max_tokens=1, arch=gfx950): launch_shape ")
    assert expected in failure["error"]


def test_an_argument_dtype_typo_fails_before_compiling(plugins):
    plugins("plug_dtype", dtype="float")
    _, failures = plan([get("plug_dtype")], [SPEC], FP)
    assert "argument 'x' dtype 'float': expected a torch dtype name" in failures[0].error


def test_a_plugin_failing_while_planning_fails_its_own_jobs_only(plugins, warm_cache):
    plugins("plug_raises", fields=("ratio",), grid="(1 // (spec.ratio - spec.ratio), 1, 1)")
    runs = []
    summary, planned = prebuild([get("router"), get("plug_raises")], SMALL_SPECS, settings_at(warm_cache), jobs=1,
                                timeout=60, progress=lambda event, job, detail: runs.append((event, job.label)))
    assert [job.label for job in planned] == ["router(max_tokens=1, arch=gfx950)"]
    assert summary.hits == 1 and summary.compiled == 0  # router, from the warm cache
    assert [f["spec"] for f in summary.failed] == [{"ratio": 128, "arch": "gfx950"}, {"ratio": 4, "arch": "gfx950"}]
    assert summary.failed[1]["error"] == ("plug_raises(ratio=4, arch=gfx950): ZeroDivisionError while planning: "
                                          "integer division or modulo by zero")
    assert ("failed", "plug_raises(ratio=4, arch=gfx950)") in runs and ("hit", planned[0].label) in runs


def test_a_source_file_that_disappears_fails_the_plugins_jobs(plugins):
    folder = plugins("plug_gone")
    template = get("plug_gone")
    (folder / "kernel.py").unlink()
    jobs, failures = plan([template, get("router")], [SPEC], FP)
    assert [j.template.name for j in jobs] == ["router"]
    assert "FileNotFoundError" in failures[0].error and "kernel.py" in failures[0].error


# --- after compiling: launches and kernargs ----------------------------------------------------


def _outcome(entry) -> Outcome:
    return Outcome(entry.key, "ok", {"hsaco": entry.hsaco, "launches": [launch.to_json() for launch in entry.meta.launches], "seconds": 0.1})


def test_arguments_are_checked_against_the_compiled_kernarg_layout(warm_cache, tmp_path):
    router, spec = get("router"), SMALL_SPECS[1]
    entry = Store(settings_at(warm_cache)).lookup(BuildJob.plan(router, spec, _fingerprint(warm_cache)).key, "gfx950")
    assert entry is not None

    class Fewer(type(router)):
        def arguments(self, spec):
            return super().arguments(spec)[:-1]  # forgets use_hash

    store = Store(settings_at(tmp_path / "fresh"))
    fewer = BuildJob.plan(Fewer(), spec, entry.meta.toolchain, router.source_digest())
    with pytest.raises(CompileError, match="the code object has 14 explicit arguments, the template declares 13"):
        fewer.finish(store, _outcome(entry))
    assert list(store.entries()) == []  # nothing the runtime could not pack is published
    same = BuildJob.plan(router, spec, entry.meta.toolchain)
    assert same.finish(store, _outcome(entry)).key == same.key  # the declared arguments match


def _fingerprint(cache: Path) -> dict:
    (fingerprint,) = Store(settings_at(cache)).recorded_toolchains("gfx950")
    return fingerprint


def test_a_grid_the_launcher_computes_at_run_time_is_explained():
    job = BuildJob.plan(get("router"), SPEC, FP)
    launch = {"kernel": "router_kernel", "grid": [None, 1, 1], "block": [256, 1, 1], "dynamic_lds": 0}
    with pytest.raises(CompileError, match=r"the launcher's grid of kernel 'router_kernel' is computed at run "
                                           r"time, not a constant: launch with the template's launch_shape"):
        job._check_launches([], [launch])


# --- what prebuild builds, and the worker's environment ---------------------------------------


def test_prebuild_defaults_to_the_layers_registered_templates_plus_configured_ones(plugins):
    plugins("plug_extra")
    layer = [name for name in LAYER_TEMPLATES if name in names()]
    assert layer and "k1" in layer
    assert default_templates(Settings({})) == layer  # no plug-in, no stand-alone template
    configured = Settings({"MONO_JIT_PREBUILD_TEMPLATES": "plug_extra, router"})
    assert default_templates(configured) == layer + ["plug_extra", "router"]


def test_prebuild_without_a_layer_template_says_so(monkeypatch):
    monkeypatch.setattr("mono_jit.pipeline.deployment.names", lambda: ["router"])
    with pytest.raises(MonoJitError, match="none of the layer's templates .* is registered"):
        default_templates(Settings({}))
    assert default_templates(Settings({"MONO_JIT_PREBUILD_TEMPLATES": "router"})) == ["router"]


def test_config_lists_the_flydsl_variables_compile_workers_drop(monkeypatch):
    from mono_jit.cli import main

    env = {"FLYDSL_RUNTIME_CACHE_DIR": "/tmp/x", "ARCH": "x86_64", "COMPILE_ONLY": "1", "KEEP_ME": "1"}
    result = CliRunner().invoke(main, ["config", "--json"], env=env)
    assert result.exit_code == 0, result.output
    row = {r["name"]: r for r in json.loads(result.output)["settings"]}["worker_env_removed"]
    assert row["value"] == ["ARCH=x86_64", "COMPILE_ONLY=1", "FLYDSL_RUNTIME_CACHE_DIR=/tmp/x"]
    text = CliRunner().invoke(main, ["config"], env=env).output
    assert "ARCH=x86_64, COMPILE_ONLY=1, FLYDSL_RUNTIME_CACHE_DIR=/tmp/x" in text
    worker = compile_environment(resolve_toolchain(Settings()), "gfx950", {**env, "PATH": "/bin"})
    assert "ARCH" not in worker and "COMPILE_ONLY" not in worker and worker["KEEP_ME"] == "1"
    assert "FLYDSL_RUNTIME_CACHE_DIR" not in worker

