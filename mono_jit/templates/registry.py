"""Template registry: every template is declared by an entry point of the group
``mono_jit.templates`` (mono-jit's own built-ins the same way as plug-ins), named after it.

A template is imported when first asked for by name (`get`), or all at once (`all_templates`);
the registry imports no template package by name. Declarations that break the contract fail
by name and leave the others usable: two declarations of one name (a plug-in reusing a
built-in's name included) name both sources, a class that fails to import or fails the checks
of templates/checks.py says why. `get` raises that reason; `problems` lists every one.
"""

from __future__ import annotations

import importlib

from ..errors import MonoJitError, TemplateError
from . import checks
from .base import Template
from .discovery import GROUP as ENTRY_POINT_GROUP
from .discovery import Declaration, declarations

__all__ = ["ENTRY_POINT_GROUP", "all_templates", "get", "names", "problems", "register"]

_registry: dict[str, Template] = {}
_added: dict[str, str] = {}  # name -> source, for classes added by register() rather than declared
_failed: dict[str, str] = {}  # name -> why it is unusable


def _warn(message: str) -> None:
    import logging  # only on a broken declaration: logging is not imported on the cache-hit path

    logging.getLogger(__name__).warning("%s", message)


def _declared() -> dict[str, list[Declaration]]:
    table: dict[str, list[Declaration]] = {}
    for declaration in declarations():
        table.setdefault(declaration.name, []).append(declaration)
    return table


def names() -> list[str]:
    """Every declared or registered template name, sorted, importing nothing."""
    return sorted(set(_declared()) | set(_registry))


def register(template_cls: type[Template]) -> type[Template]:
    """Add a template class that no entry point declares (a script's or a test's own); its name
    must be free. Usable as a decorator."""
    name = getattr(template_cls, "name", None)
    source = f"{template_cls.__module__}:{template_cls.__qualname__}"
    if not isinstance(name, str):
        raise TemplateError(f"{source}: name={name!r}: expected the template's name")
    declared = _declared().get(name, [])
    if any(d.target() == (template_cls.__module__, template_cls.__qualname__) for d in declared):
        raise TemplateError(f"template {name!r} is declared by the entry point {declared[0].source}: drop the "
                            "register() call, the entry point registers it")
    taken = [d.source for d in declared]
    if name in _added and _added[name] != source:
        taken.append(_added[name])
    if taken:
        raise TemplateError(f"template {name!r} is declared twice: by {taken[0]} and by {source}")
    if name in _added:
        return template_cls
    _registry[name] = checks.checked_template(template_cls, name, source)
    _added[name] = source
    return template_cls


def _load(name: str, declared: list[Declaration]) -> Template:
    if len(declared) > 1:
        raise TemplateError(f"template {name!r} is declared twice: by {declared[0].source} and by "
                            f"{declared[1].source}; uninstall one of them")
    (declaration,) = declared
    module, attribute = declaration.target()
    try:
        found = importlib.import_module(module)
        for part in attribute.split(".") if attribute else ():
            found = getattr(found, part)
    except Exception as exc:  # a plug-in's import error, whatever it is, is that plug-in's failure
        raise TemplateError(f"template {name!r} ({declaration.source}) failed to load: "
                            f"{type(exc).__name__}: {exc}") from None
    return checks.checked_template(found, name, declaration.source)


def _resolve(name: str, declared: list[Declaration]) -> Template:
    """The loaded template, loading it once; a failure is remembered, warned about and raised."""
    if name in _registry:
        return _registry[name]
    if name not in _failed:
        try:
            _registry[name] = _load(name, declared)
            return _registry[name]
        except MonoJitError as exc:
            _failed[name] = str(exc)
            _warn(_failed[name])
    raise TemplateError(_failed[name])


def get(name: str) -> Template:
    """The template called `name`, importing only its own declaration."""
    if name in _registry:
        return _registry[name]
    declared = _declared()
    if name not in declared:
        known = names()
        hint = ", ".join(known) if known else "none (is mono-jit installed? pip install -e .)"
        raise MonoJitError(f"template {name!r} is not registered; known: {hint}")
    return _resolve(name, declared[name])


def all_templates() -> dict[str, Template]:
    """Every usable template by name (each declaration imported); see `problems` for the others."""
    for name, declared in _declared().items():
        try:
            _resolve(name, declared)
        except MonoJitError:
            continue
    return dict(sorted(_registry.items()))


def problems() -> dict[str, str]:
    """Why each unusable declaration is unusable, after trying to load every one."""
    all_templates()
    return dict(sorted(_failed.items()))
