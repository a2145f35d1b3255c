"""One family of errors: every exception class mono-jit defines derives from MonoJitError (so
`except MonoJitError` catches whatever it raises on purpose), but for the internal ones listed
here with the error each is turned into before a caller sees it. Found by reading the sources,
not by importing them (the emulator and the runtime need numba and torch)."""

from __future__ import annotations

import ast
from pathlib import Path

import mono_jit

ROOTS = (Path(mono_jit.__file__).parent, Path(mono_jit.__file__).parent.parent / "cache")
BUILTIN = {"Exception", "BaseException", "ValueError", "AssertionError", "OSError", "RuntimeError", "TypeError",
           "KeyError", "LookupError", "IOError", "EnvironmentError"}
# Raised and caught inside the cache: never seen by a caller as itself.
INTERNAL = {"UnsafeFile": "store.py turns it into CorruptEntry (a miss, the copy quarantined)"}


def _classes() -> dict[str, tuple[str, list[str]]]:
    """Every class defined under the package's sources: name -> (file, base names)."""
    found = {}
    for root in ROOTS:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                             if isinstance(b, (ast.Name, ast.Attribute))]
                    found[node.name] = (str(path), bases)
    return found


def test_every_exception_mono_jit_defines_is_a_monojiterror():
    classes = _classes()

    def is_exception(name: str) -> bool:
        return name in BUILTIN or (name in classes and any(is_exception(b) for b in classes[name][1]))

    def in_family(name: str) -> bool:
        return name == "MonoJitError" or (name in classes and any(in_family(b) for b in classes[name][1]))

    outside = sorted(f"{name} ({classes[name][0]})" for name in classes
                     if name not in BUILTIN and is_exception(name) and not in_family(name) and name not in INTERNAL)
    assert outside == []
    assert set(INTERNAL) <= set(classes)  # no stale exemption


def test_the_launch_checks_name_an_emulator_error_by_kind_and_print_mono_jits_own_as_they_are():
    """Emulator errors joined the family; the launch checks still report one with its kind (the
    kernel did not run as the device would) and a miss or a failed compile by its message."""
    from mono_jit.emulator.errors import EmulatorError
    from mono_jit.errors import OfflineMiss
    from mono_jit.selfcheck import _one
    from mono_jit.spec import Spec

    class Deadlock(EmulatorError):
        pass

    def raising(error):
        def launcher(*args):
            raise error
        return launcher

    spec = Spec(8, 4, 1024, 1)
    hung = _one("router", spec, None, 0, None, raising(Deadlock("every wave waits at a barrier")))
    missed = _one("router", spec, None, 0, None, raising(OfflineMiss("router(max_tokens=1) is not cached")))
    assert hung.problem == "Deadlock: every wave waits at a barrier" and not hung.ok
    assert missed.problem == "router(max_tokens=1) is not cached" and not missed.ok
