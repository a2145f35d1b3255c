"""Template registry: the built-in families plus any a package adds through the entry-point
group ``mono_jit.templates`` (each entry a Template subclass)."""

from __future__ import annotations

import importlib

from ..errors import MonoJitError
from .base import Template

ENTRY_POINT_GROUP = "mono_jit.templates"
# Built-in template name -> its package (relative to this one), imported when first asked for.
BUILTINS = {"k1": ".k1", "k2": ".k2", "keytable": ".keytable", "router": ".router"}
_registry: dict[str, Template] = {}
_loaded_entry_points = False


def _warn(message: str, *args: object) -> None:
    import logging  # only on a broken plug-in: logging is not imported on the cache-hit path

    logging.getLogger(__name__).warning(message, *args)


def register(template_cls: type[Template]) -> type[Template]:
    """Add a template class (usable as a decorator); a second class under one name is an error."""
    instance = template_cls()
    existing = _registry.get(instance.name)
    if existing is not None and type(existing) is not template_cls:
        raise MonoJitError(
            f"template {instance.name!r} is registered twice: {type(existing).__module__} and {template_cls.__module__}"
        )
    _registry[instance.name] = instance
    return template_cls


def _load_entry_points() -> None:
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    import importlib.metadata  # slow to import and to scan: only when a plug-in is asked for

    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = ep.load()
        except Exception as exc:  # a broken plug-in must not take the built-ins down
            _warn("template entry point %s (%s) failed to load: %s", ep.name, ep.value, exc)
            continue
        if isinstance(cls, type) and issubclass(cls, Template):
            if cls().name not in _registry:
                register(cls)
        else:
            _warn("template entry point %s is not a Template subclass: %r", ep.name, cls)


def _load_builtins(*names: str) -> None:
    """Import the named built-ins (all when none is named); registration happens on import."""
    for name in names or tuple(BUILTINS):
        importlib.import_module(BUILTINS[name], __package__)


def all_templates() -> dict[str, Template]:
    _load_builtins()
    _load_entry_points()
    return dict(sorted(_registry.items()))


def get(name: str) -> Template:
    """The template called `name`. Built-ins win over plug-ins, so they are looked up without
    scanning the entry points (a scan of every installed distribution), and only the one asked
    for is imported."""
    if name in _registry:
        return _registry[name]
    if name in BUILTINS:
        _load_builtins(name)
    if name in _registry:
        return _registry[name]
    templates = all_templates()
    if name not in templates:
        raise MonoJitError(f"template {name!r} is not registered; known: {', '.join(templates) or 'none'}")
    return templates[name]
