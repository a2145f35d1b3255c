"""Every mono-jit setting in one place, read once from the environment, each with its source.

Constructors elsewhere take a :class:`Settings`; nothing else reads ``MONO_JIT_*`` variables,
so `mono-jit config` can show exactly what is in force and where it came from.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from mono_jit.record import Record

if TYPE_CHECKING:
    from mono_jit.cache.oci.reference import Reference


class Setting(Record):
    """One setting: its value, the variable that sets it and where the value came from."""

    name: str
    env: str
    value: object
    source: str  # "env" or "default"
    help: str


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _flag(text: str) -> bool:
    """A boolean setting: one of 1 / true / yes / on or 0 / false / no / off (any case); anything
    else is an error, never silently off."""
    word = text.strip().lower()
    if word not in _TRUE + _FALSE:
        raise ValueError(f"expected one of {', '.join(_TRUE + _FALSE)}")
    return word in _TRUE


def _cache_dir(text: str) -> Path:
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError("it is not a folder")
    return path


def _paths(text: str) -> tuple[Path, ...]:
    return tuple(Path(p).expanduser() for p in text.split(os.pathsep) if p)


def _default_cache_dir() -> Path:
    import platformdirs  # only when MONO_JIT_CACHE_DIR is unset

    return Path(platformdirs.user_cache_dir("mono-jit"))


def _words(text: str) -> tuple[str, ...]:
    words = tuple(w.strip() for w in text.split(",") if w.strip())
    if not words:
        raise ValueError("expected a comma list of template names")
    return words


SECONDS_MAX = 86400.0  # one day: the longest wait any setting or option takes; no value turns a wait off


def bounded_seconds(value: float, lowest: float = 0.0, given: str | None = None) -> float:
    """`value` if it is a finite number of seconds above 0, at least `lowest` and at most
    SECONDS_MAX; otherwise ValueError saying what was expected and what was `given` (default: the
    value). NaN fails every comparison, so each bound is checked as what must hold."""
    got = given if given is not None else repr(value)
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number of seconds, at most {SECONDS_MAX:.0f} (no value turns a wait "
                         f"off: every wait ends), got {got}")
    if not (value > 0 and value >= lowest):
        raise ValueError(f"expected a positive number of seconds{f' (at least {lowest:g})' if lowest else ''}, "
                         f"got {got}")
    if not value <= SECONDS_MAX:
        raise ValueError(f"expected at most {SECONDS_MAX:.0f} seconds (one day), got {got}")
    return value


def _seconds(text: str) -> float:
    return bounded_seconds(float(text), given=repr(text))


PEER_WAIT_MAX = (2**31 - 1) / 1e6  # seconds: K2 takes the limit as i32 microseconds
PEER_WAIT_DEFAULT = 30.0  # seconds


def _peer_wait(text: str) -> float:
    value = float(text)
    if not 1e-6 <= value <= PEER_WAIT_MAX:  # written as what must hold: NaN fails it
        raise ValueError(f"expected 0.000001 to {PEER_WAIT_MAX:.0f} seconds (K2 takes it as i32 microseconds), "
                         f"got {text!r}")
    return value


def _remote(text: str) -> "Reference":
    from mono_jit.cache.oci.reference import parse_reference  # only when MONO_JIT_REMOTE is set

    return parse_reference(text)


def _insecure(text: str) -> tuple[str, ...]:
    from mono_jit.cache.oci.reference import insecure_hosts

    return insecure_hosts(text)


# The ways the runner can run the kernels (mono_jit.runtime.backends implements one class each).
BACKENDS: dict[str, str] = {
    "hip": "the cached code objects on the GPU",
    "reference": "the templates' torch references on the same tensors",
    "emulator": "the cached code objects on the gfx950 emulator, on the CPU",
}


def _one_of(names: Iterable[str]) -> str:
    quoted = [repr(name) for name in names]
    return f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _backend(text: str) -> str:
    if text not in BACKENDS:
        raise ValueError(f"expected {_one_of(BACKENDS)}, got {text!r}")
    return text


# name, variable, parser, default factory, help
_TABLE: tuple[tuple[str, str, Callable[[str], object], Callable[[], object], str], ...] = (
    ("cache_dir", "MONO_JIT_CACHE_DIR", _cache_dir,
     _default_cache_dir, "the writable cache root"),
    ("cache_path", "MONO_JIT_CACHE_PATH", _paths, tuple,
     "read-only cache roots searched before the writable one (colon-separated)"),
    ("lock_dir", "MONO_JIT_LOCK_DIR", lambda s: Path(s).expanduser(), lambda: None,
     "per-key compile locks (local storage); default <cache_dir>/v1/locks"),
    ("offline", "MONO_JIT_OFFLINE", _flag, lambda: False, "a cache miss is an error, never a compile"),
    ("lock_timeout", "MONO_JIT_LOCK_TIMEOUT", _seconds, lambda: 900.0,
     "seconds to wait for another process compiling the same key"),
    ("compile_timeout", "MONO_JIT_COMPILE_TIMEOUT", _seconds, lambda: 600.0,
     "seconds one compile may take in its worker"),
    ("allow_shared_roots", "MONO_JIT_ALLOW_SHARED_ROOTS", _flag, lambda: False,
     "accept cache roots writable by others or owned by another user"),
    ("ld_lld", "MONO_JIT_LD_LLD", lambda s: Path(s).expanduser(), lambda: None,
     "ld.lld to link code object v6 with (default: searched)"),
    ("device_libs", "MONO_JIT_DEVICE_LIBS", lambda s: Path(s).expanduser(), lambda: None,
     "folder of AMDGPU device bitcode (ocml.bc ...) (default: searched)"),
    ("exact_toolchain", "MONO_JIT_EXACT_TOOLCHAIN", _flag, lambda: False,
     "serve only entries this host's toolchain built (default: when it has none, the same build by a toolchain "
     "recorded in the layers serves)"),
    ("vllm_plugin", "MONO_JIT_VLLM", _flag, lambda: True,
     "serve vLLM's --monokernel runner with mono-jit's (0: leave vLLM's own in place)"),
    ("remote", "MONO_JIT_REMOTE", _remote, lambda: None,
     "OCI reference a miss is fetched from before compiling (e.g. registry.example/team/mono-jit:dsv4-pro-tp8)"),
    ("remote_push", "MONO_JIT_REMOTE_PUSH", _flag, lambda: False,
     "push what a miss compiled to MONO_JIT_REMOTE"),
    ("remote_insecure", "MONO_JIT_REMOTE_INSECURE", _insecure, tuple,
     "registries (host:port, comma-separated) reached over plain HTTP; every other one needs HTTPS"),
    ("remote_timeout", "MONO_JIT_REMOTE_TIMEOUT", _seconds, lambda: 10.0,
     "seconds one registry request may take before the registry counts as down"),
    ("prebuild_templates", "MONO_JIT_PREBUILD_TEMPLATES", _words, tuple,
     "templates a plain `mono-jit prebuild` builds besides the layer's (plug-ins, router, keytable; comma list)"),
    ("peer_wait", "MONO_JIT_PEER_WAIT", _peer_wait, lambda: PEER_WAIT_DEFAULT,
     "seconds a K2 launch waits for a peer rank's all-reduce data before it traps (fails the step)"),
    ("backend", "MONO_JIT_BACKEND", _backend, lambda: "hip",
     "how the runner runs the kernels: " + "; ".join(f"{name} ({what})" for name, what in BACKENDS.items())),
)


class Settings:
    """The settings in force, from an environment mapping (default: os.environ). Each setting of
    the table above is an attribute of the type its parser returns (tests/test_config.py checks
    the two lists agree)."""

    cache_dir: Path
    cache_path: tuple[Path, ...]
    lock_dir: Path | None
    offline: bool
    lock_timeout: float
    compile_timeout: float
    allow_shared_roots: bool
    ld_lld: Path | None
    device_libs: Path | None
    exact_toolchain: bool
    vllm_plugin: bool
    remote: Reference | None
    remote_push: bool
    remote_insecure: tuple[str, ...]
    remote_timeout: float
    prebuild_templates: tuple[str, ...]
    peer_wait: float
    backend: str

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        items: dict[str, Setting] = {}
        for name, var, parse, default, help_text in _TABLE:
            raw = environ.get(var, "")
            if raw != "":
                try:
                    value, source = parse(raw), "env"
                except ValueError as exc:
                    from .errors import MonoJitError

                    raise MonoJitError(f"{var}={raw!r}: {exc}") from None
            else:
                value, source = default(), "default"
            items[name] = Setting(name, var, value, source, help_text)
        self._set(items)

    def _set(self, items: dict[str, Setting]) -> None:
        self._items = items
        for name, setting in items.items():
            setattr(self, name, setting.value)

    def items(self) -> list[Setting]:
        return list(self._items.values())

    def replaced(self, **values: object) -> "Settings":
        """A copy with `values` in force (source "override") whatever the environment says: for
        a check that must neither compile nor fetch, say."""
        unknown = sorted(set(values) - set(self._items))
        if unknown:
            raise AttributeError(f"no such setting: {', '.join(unknown)}")
        copy = Settings.__new__(Settings)
        copy._set({**self._items, **{name: self._items[name]._replace(value=value, source="override")
                                     for name, value in values.items()}})
        return copy

    @property
    def writable_root(self) -> Path:
        return self.cache_dir

    @property
    def readonly_roots(self) -> tuple[Path, ...]:
        return self.cache_path

    def locks(self) -> Path:
        return self.lock_dir if self.lock_dir is not None else self.writable_root / "v1" / "locks"
