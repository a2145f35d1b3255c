"""mono-jit's vLLM plug-in: vLLM's `--monokernel` layers run on mono-jit's runner.

vLLM 0.33 loads every `vllm.general_plugins` entry point in each of its processes before a
model is built (`vllm/plugins/__init__.py`). `register` installs, once, an import finder that
answers for `vllm.models.deepseek_v4.amd.mono.runner`, the module vLLM's own hook
(`vllm/models/deepseek_v4/amd/mono_decode.py`) imports lazily for `BLOCKS`, `MonoRunner`,
`AttnWeights` and `MonoLayerWeights`; it gets mono-jit's (`served.py`). vLLM's
`MonoDecodeLayer` keeps every gate of its own. Nothing else of vLLM is touched, and without
`--monokernel` the module is never imported, so the plug-in costs nothing.

`MONO_JIT_VLLM=0` leaves vLLM's own module in place; so does a vLLM other than the one the
plug-in was written against (logged once). `register` imports nothing of vLLM, torch or FlyDSL.
"""

from __future__ import annotations

import logging
import sys

from .finder import RunnerFinder


def register() -> None:
    """The entry point: install the finder (idempotent, cheap)."""
    from ..config import Settings
    from ..errors import MonoJitError

    try:
        enabled = Settings().vllm_plugin
    except MonoJitError as exc:  # a malformed MONO_JIT_* setting must not take vLLM down
        logging.getLogger("mono_jit.vllm").warning("mono-jit's vLLM plug-in is off: %s", exc)
        return
    if not enabled:
        return
    if not any(isinstance(finder, RunnerFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, RunnerFinder())
