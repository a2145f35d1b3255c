"""Kernel templates: the protocol (base), its checks, the registry (the ``mono_jit.templates``
entry points) and the built-in families."""

from .base import Argument, Build, LaunchShape, Template, WorkBuffer
from .registry import all_templates, get, names, problems, register

__all__ = ["Argument", "Build", "LaunchShape", "Template", "WorkBuffer", "all_templates", "get", "names", "problems",
           "register"]
