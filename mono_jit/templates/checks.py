"""The template contract, checked where a mistake would otherwise pass silently.

At registration (`checked_template`): the class's name, Spec fields, source files and kernel
module, so a typo fails with the plug-in's name instead of keying builds wrongly (a dropped
spec field gave the runtime another bucket's kernel). Before compiling (`launch_shape`,
`arguments`): the template's answers for one spec are plain constants of the right types.
When the launcher is built (`match_build`): its parameters are the declared arguments by name,
in order, each of its kind, and its compile placeholders have each argument's kind and dtype. After compiling (`match_kernargs`): the declared arguments are
the compiled kernel's kernargs by kind and size (FlyDSL 0.5's code objects give no argument
names, ``.args[].name`` is absent, so names are checked on the launcher, which the kernarg
layout follows parameter by parameter).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
from typing import Any

from ..errors import TemplateError
from ..hsaco.resources import LDS_PER_CU, Budget
from ..spec import SPEC_FIELDS, Spec
from .base import Argument, Build, LaunchShape, Template

# A template name is a word of the CLI's comma lists and of file names.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_ARGUMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_BLOCK = 1024  # threads per workgroup on gfx950
MAX_GRID = 2**31 - 1
# torch dtype names a tensor argument may declare (the runtime compares str(tensor.dtype)).
TENSOR_DTYPES = frozenset({
    "bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
    "float32", "float64", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
})
SCALAR_DTYPES = {"i32": "int32", "i64": "int64"}  # a scalar argument's kind -> its dtype


def checked_template(cls: Any, name: str, source: str) -> Template:
    """An instance of `cls`, declared as `name` by `source`, after the contract's class checks."""
    where = f"template {name!r} ({source})"
    if not (isinstance(cls, type) and issubclass(cls, Template)):
        raise TemplateError(f"{where}: {cls!r} is not a subclass of mono_jit.templates.Template")
    declared = getattr(cls, "name", None)
    if declared != name:
        raise TemplateError(f"{where}: the class's name is {declared!r}; it must be the entry point's name {name!r}")
    if not _NAME.fullmatch(name):
        raise TemplateError(f"{where}: name {name!r}: expected letters, digits, '_', '.' or '-'")
    _check_spec_fields(cls, where)
    _check_source_files(cls, where)
    _check_kernel_module(cls, where)
    if not isinstance(getattr(cls, "persistent", None), bool):
        raise TemplateError(f"{where}: persistent={cls.persistent!r}: expected True or False")
    if not isinstance(getattr(cls, "budget", None), Budget):
        raise TemplateError(f"{where}: budget={cls.budget!r}: expected a mono_jit.hsaco.resources.Budget")
    try:
        return cls()
    except TypeError as exc:  # abstract methods left unimplemented
        raise TemplateError(f"{where}: cannot be instantiated: {exc}") from None


def _strings(cls: type, attribute: str, where: str) -> tuple[str, ...]:
    value = getattr(cls, attribute, None)
    if isinstance(value, str) or not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
        raise TemplateError(f"{where}: {attribute}={value!r}: expected a tuple of strings")
    return tuple(value)


def _check_spec_fields(cls: type, where: str) -> None:
    for field in _strings(cls, "spec_fields", where):
        if field not in SPEC_FIELDS:
            raise TemplateError(f"{where}: spec_fields names {field!r}, which is not a Spec field "
                                f"(expected some of {', '.join(SPEC_FIELDS)})")


def _check_source_files(cls: type[Template], where: str) -> None:
    try:
        root = cls.source_root()
    except ValueError as exc:
        raise TemplateError(f"{where}: {exc}") from None
    if getattr(cls, "source_files", None) is None:  # the build's imports alone
        return
    files = _strings(cls, "source_files", where)
    if not files:
        raise TemplateError(f"{where}: source_files is empty: leave it out (the files the build imports are found "
                            "without it) or list the other files the build reads")
    folder = os.fspath(root)
    for rel in files:  # strings, not paths: every serving process checks its templates' files once
        parts = [part for part in rel.split("/") if part not in ("", ".")]
        if not parts or rel.startswith("/") or ".." in parts:
            raise TemplateError(f"{where}: source file {rel!r}: expected a path inside {root} (relative, no '..')")
        if not os.path.isfile(os.path.join(folder, rel)):
            raise TemplateError(f"{where}: source file {rel!r} is not a file in {root} (source_files are relative "
                                "to the folder of the class's top-level package)")


def _check_kernel_module(cls: type[Template], where: str) -> None:
    module = getattr(cls, "kernel_module", None)
    if not isinstance(module, str) or not module.strip("."):
        raise TemplateError(f"{where}: kernel_module={module!r}: expected a module name, e.g. '.kernel'")
    try:
        absolute = cls.kernel_module_name()
        found = importlib.util.find_spec(absolute) is not None
    except (ImportError, ValueError):
        absolute, found = module, False
    if not found:
        raise TemplateError(f"{where}: kernel_module {module!r}: no module {absolute} (a leading '.' is relative "
                            f"to {cls.package()}, the package that defines the class)")


def _positive_ints(values: Any, what: str, label: str, limit: int) -> None:
    if not isinstance(values, tuple) or len(values) != 3:
        raise TemplateError(f"{label}: launch_shape {what}={values!r}: expected a tuple of three integers")
    for axis, value in zip("xyz", values):
        if type(value) is not int:
            raise TemplateError(
                f"{label}: launch_shape {what}.{axis}={value!r} ({type(value).__name__}) is not a constant: a launch "
                "shape must be Python ints fixed by the spec (every launch of a build uses the shape its entry "
                "records, so it cannot depend on a runtime argument)")
        if not 1 <= value <= limit:
            raise TemplateError(f"{label}: launch_shape {what}.{axis}={value}: expected 1 to {limit}")


def launch_shape(template: Template, spec: Spec, label: str) -> LaunchShape:
    """The template's launch shape for `spec`, checked to be constants a launch can use."""
    shape = template.launch_shape(spec)
    if not isinstance(shape, LaunchShape):
        raise TemplateError(f"{label}: launch_shape returned {shape!r}: expected a LaunchShape")
    _positive_ints(shape.grid, "grid", label, MAX_GRID)
    _positive_ints(shape.block, "block", label, MAX_BLOCK)
    if math.prod(shape.block) > MAX_BLOCK:
        raise TemplateError(f"{label}: launch_shape block={shape.block}: more than {MAX_BLOCK} threads")
    if type(shape.dynamic_lds) is not int or not 0 <= shape.dynamic_lds <= LDS_PER_CU:
        raise TemplateError(f"{label}: launch_shape dynamic_lds={shape.dynamic_lds!r}: expected a constant "
                            f"int from 0 to {LDS_PER_CU} bytes")
    return shape


def arguments(template: Template, spec: Spec, label: str) -> tuple[Argument, ...]:
    """The template's arguments for `spec`, checked: named once each, of a kind and dtype the
    runtime can pack."""
    declared = template.arguments(spec)
    if not isinstance(declared, tuple) or not all(isinstance(a, Argument) for a in declared):
        raise TemplateError(f"{label}: arguments returned {declared!r}: expected a tuple of Argument")
    seen: set[str] = set()
    for argument in declared:
        if not isinstance(argument.name, str) or not _ARGUMENT.fullmatch(argument.name) or argument.name in seen:
            raise TemplateError(f"{label}: argument name {argument.name!r}: expected a distinct identifier")
        seen.add(argument.name)
        if argument.kind not in SCALAR_DTYPES and argument.kind != "tensor":
            raise TemplateError(f"{label}: argument {argument.name!r} kind {argument.kind!r}: expected 'tensor' "
                                "(a 1-D buffer: pointer + i32 length), 'i32' or 'i64'")
        if argument.kind == "tensor" and argument.dtype not in TENSOR_DTYPES:
            raise TemplateError(f"{label}: argument {argument.name!r} dtype {argument.dtype!r}: expected a torch "
                                f"dtype name ({', '.join(sorted(TENSOR_DTYPES))})")
        if argument.kind in SCALAR_DTYPES and argument.dtype != SCALAR_DTYPES[argument.kind]:
            raise TemplateError(f"{label}: argument {argument.name!r}: an {argument.kind} scalar has dtype "
                                f"{SCALAR_DTYPES[argument.kind]!r}, not {argument.dtype!r}")
    return declared


# FlyDSL parameter annotations (their class names) -> the argument kind they lower to.
_PARAMETER_KINDS = {"Tensor": "tensor", "Int32": "i32", "Int64": "i64"}


def _spelling(name: str) -> str:
    """A name without case or underscores: a launcher's ``HashIds`` and an argument's ``hash_ids``."""
    return name.replace("_", "").lower()


def launcher_parameters(launcher: Any) -> list[tuple[str, str]]:
    """(name, kind) of a FlyDSL launcher's parameters before its trailing stream (a kind is
    'tensor', 'i32', 'i64', or the annotation's text when it is none of those)."""
    import inspect

    function = getattr(launcher, "func", launcher)  # flyc.jit wraps the Python function
    found = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name == "stream":
            break
        annotation = parameter.annotation
        text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
        found.append((parameter.name, _PARAMETER_KINDS.get(text.rsplit(".", 1)[-1], text)))
    return found


def match_parameters(label: str, declared: tuple[Argument, ...], parameters: list[tuple[str, str]]) -> None:
    """Raise unless the launcher's (name, kind) parameters are `declared`, in order, by name
    (ignoring case and underscores) and kind: two arguments of one kind swapped in either place
    pack each other's values, which kinds and sizes alone cannot show."""
    if len(parameters) != len(declared):
        raise TemplateError(f"{label}: the launcher has {len(parameters)} parameters before its stream, "
                            f"arguments() declares {len(declared)}")
    for position, ((name, kind), argument) in enumerate(zip(parameters, declared)):
        if _spelling(name) != _spelling(argument.name) or kind != argument.kind:
            raise TemplateError(f"{label}: launcher parameter {position} is {name} ({kind}), arguments() declares "
                                f"{argument.name} ({argument.kind}) there: declare the arguments in the "
                                "launcher's order, named as its parameters")


def match_placeholders(label: str, declared: tuple[Argument, ...], placeholders: tuple) -> None:
    """Raise unless the compile placeholders are `declared`'s, in order: a tensor of the argument's
    dtype for a tensor, a Python int for a scalar (what the kernel is traced with)."""
    if len(placeholders) != len(declared):
        raise TemplateError(f"{label}: the build has {len(placeholders)} placeholders, arguments() declares "
                            f"{len(declared)}")
    for argument, placeholder in zip(declared, placeholders):
        if argument.kind == "tensor":
            got = str(getattr(placeholder, "dtype", type(placeholder).__name__)).removeprefix("torch.")
            if got != argument.dtype:
                raise TemplateError(f"{label}: the placeholder of {argument.name} is {got}, arguments() declares "
                                    f"a {argument.dtype} tensor")
        elif type(placeholder) is not int:
            raise TemplateError(f"{label}: the placeholder of {argument.name} is a {type(placeholder).__name__}, "
                                f"arguments() declares an {argument.kind} (a Python int)")


def match_build(label: str, declared: tuple[Argument, ...], build: Build) -> None:
    """A freshly built launcher and its placeholders against the declared arguments. A launcher
    whose arguments are all scalars takes one leading tensor that no kernel reads (FlyDSL compiles
    without launching only when some placeholder is a CPU tensor): it is left out."""
    parameters, placeholders = launcher_parameters(build.launcher), tuple(build.placeholders)
    scalars_only = bool(declared) and all(argument.kind != "tensor" for argument in declared)
    if scalars_only and len(parameters) == len(declared) + 1 and parameters[0][1] == "tensor":
        parameters, placeholders = parameters[1:], placeholders[1:]
    match_parameters(label, declared, parameters)
    match_placeholders(label, declared, placeholders)


def match_kernargs(label: str, declared: tuple[Argument, ...], kernel: Any) -> None:
    """Raise unless the compiled `kernel`'s explicit kernargs are exactly `declared`'s (a tensor
    is a pointer and its i32 extent, an i32 one value): what the runtime will pack."""
    from mono_jit.cache.meta import LaunchDims, StoredArgument

    from ..errors import MonoJitError
    from .kernargs import DeclaredMeta, DeclaredTable, layout

    arguments = tuple(StoredArgument.of(a) for a in declared)
    try:
        layout(DeclaredMeta(label, arguments, (DeclaredTable(kernel.args),), LaunchDims((1, 1, 1), (1, 1, 1), 0)))
    except MonoJitError as exc:
        names = ", ".join(f"{a.name}:{a.kind}" for a in declared)
        raise TemplateError(f"{exc} (kernel {kernel.name}; arguments() declares {names}; the launcher's "
                            "parameters must be these, in this order: 1-D tensors, fx.Int32 and fx.Int64)") from None
