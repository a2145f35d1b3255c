"""mono-jit's log lines in a vLLM process, through vLLM's own handlers."""

from __future__ import annotations

import logging


def log_through_vllm() -> None:
    """Send mono-jit's log lines to vLLM's handlers (vLLM configures its `vllm` logger only, so
    the runner's info lines, "runner ready" among them, would otherwise be dropped), at vLLM's
    level. A logging set-up that already routes `mono_jit` is left as it is."""
    ours, theirs = logging.getLogger("mono_jit"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.getEffectiveLevel())
    ours.propagate = False
