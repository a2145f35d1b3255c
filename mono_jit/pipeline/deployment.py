"""What one deployment needs from the cache, and a check that the layers here serve all of it.

``default_templates`` is what a plain ``mono-jit prebuild`` builds; ``builds`` turns templates
and a grid of specs into one (template, spec) per distinct build (a template that does not read
a field builds once across its values). ``check`` resolves every build as a serving process
would (every entry verified: size, sha256, key, ELF header), offline and with no registry, so it
never compiles, fetches or writes and needs no FlyDSL: on a host without a toolchain, keys are
computed under the toolchains recorded in the layers, as the runner computes them. It reports
every miss with its reason instead of stopping at the first (``mono-jit prebuild --check``, the
serving image's build-time guard).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from mono_jit.cache.meta import build_label

from ..config import Settings
from ..errors import MonoJitError
from ..spec import Spec
from ..templates import Template, names


LAYER_TEMPLATES = ("k1", "k2")  # the decode layer's templates: what the runner loads


def default_templates(settings: Settings) -> list[str]:
    """What a prebuild without named templates builds: the decode layer's templates that are
    registered (LAYER_TEMPLATES), then those MONO_JIT_PREBUILD_TEMPLATES names (plug-ins and
    stand-alone templates are built only when named or configured)."""
    registered = set(names())
    chosen = [name for name in LAYER_TEMPLATES if name in registered]
    chosen += [name for name in settings.prebuild_templates if name not in chosen]
    if not chosen:
        raise MonoJitError(f"none of the layer's templates ({', '.join(LAYER_TEMPLATES)}) is registered and "
                           "MONO_JIT_PREBUILD_TEMPLATES names none: is mono-jit installed (pip install -e .)?")
    return chosen


def label(template: Template, spec: Spec) -> str:
    """A build as prebuild names it: the template and the spec fields it reads."""
    return build_label(template.name, template.key_spec(spec))


def builds(templates: Iterable[Template], specs: Iterable[Spec]) -> list[tuple[Template, Spec]]:
    """Each template at each spec, once per distinct build, in order."""
    specs = list(specs)
    seen: set[str] = set()
    chosen = []
    for template in templates:
        for spec in specs:
            name = label(template, spec)
            if name not in seen:
                seen.add(name)
                chosen.append((template, spec))
    return chosen


@dataclass
class GridCheck:
    """Whether the layers serve a deployment's every build: one row per build, a hit with the
    entry that serves it or a miss with why."""

    rows: list[dict] = field(default_factory=list)  # {template, spec, label, hit, path, reason}

    @property
    def misses(self) -> list[dict]:
        return [row for row in self.rows if not row["hit"]]

    @property
    def ok(self) -> bool:
        return not self.misses

    def as_dict(self) -> dict:
        return {"ok": self.ok, "builds": len(self.rows), "hits": len(self.rows) - len(self.misses),
                "misses": len(self.misses), "rows": self.rows}


def check(templates: Iterable[Template], specs: Iterable[Spec], settings: Settings) -> GridCheck:
    """Resolve every build of `templates` x `specs` offline, from the layers alone."""
    from .resolve import resolve_each

    # Offline and no registry: the check asks what these layers serve, and writes nothing.
    offline = settings.replaced(offline=True, remote=None)
    chosen = builds(templates, specs)
    report = GridCheck()
    for (template, spec), result in zip(chosen, resolve_each(chosen, settings=offline)):
        if isinstance(result, MonoJitError):
            path, reason = None, str(result)
        else:
            path, reason = str(result.entry.path), None
        report.rows.append({"template": template.name, "spec": template.key_spec(spec), "label": label(template, spec),
                            "hit": reason is None, "path": path, "reason": reason})
    return report
