"""Kernel templates: the protocol (base), the registry and the built-in families."""

from .base import Argument, Build, LaunchShape, Template
from .registry import all_templates, get, register

__all__ = ["Argument", "Build", "LaunchShape", "Template", "all_templates", "get", "register"]
