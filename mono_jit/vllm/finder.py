"""The import finder that serves vLLM's mono runner module with mono-jit's.

The served module is a fresh module named as vLLM's, filled with the names of
`mono_jit.vllm.served` when it executes. Its execution is where the deployment is checked
(the HIP runtime, for the hip backend): an ImportError there is what vLLM turns into its
start-up refusal, "--monokernel needs FlyDSL and AITER's FlyDSL helpers (<our reason>)"
(`mono_decode._deployment_error`), so a host that cannot run the kernels says why at start-up.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from types import ModuleType

from .logs import log_through_vllm

RUNNER_MODULE = "vllm.models.deepseek_v4.amd.mono.runner"
VLLM_VERSION = "0.33.0"  # the hook, runner contract and gates this plug-in was written against
log = logging.getLogger("mono_jit.vllm")


class RunnerFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds RUNNER_MODULE (on the vLLM it was written for) and loads it from mono-jit."""

    _warned = False

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        if fullname != RUNNER_MODULE:
            return None
        vllm = sys.modules.get("vllm")
        version = getattr(vllm, "__version__", None)
        if version != VLLM_VERSION:
            if not RunnerFinder._warned:
                RunnerFinder._warned = True
                log_through_vllm()
                log.warning("mono-jit's vLLM plug-in was written for vLLM %s, not %s: vLLM's own mono runner "
                            "stays in place", VLLM_VERSION, version)
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin="mono-jit")

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default: a fresh module object

    def exec_module(self, module: ModuleType) -> None:
        from . import served

        log_through_vllm()
        served.check_deployment()
        module.__dict__.update({name: getattr(served, name) for name in served.__all__})
        module.__doc__ = served.__doc__
