"""The arguments a shipped template only reads (its weights), by template name. The emulator
backend registers them read-only: a write into one faults, and the weak-memory mode leaves them
untracked (nothing writes them, so no cache can hold a stale copy). Kept out of the templates'
packages, whose every byte is part of their cache keys."""

from __future__ import annotations

READ_ONLY: dict[str, frozenset[str]] = {
    "k1": frozenset({"hc_fn", "hc_base", "hc_scale", "attn_norm", "w_qkv", "s_qkv", "q_norm", "kv_norm", "w_qb",
                     "s_qb", "rope"}),
}


def read_only_arguments(template: str) -> frozenset[str]:
    """The names of `template`'s arguments that its kernel never writes (none for a template
    not listed: registered writable, as before)."""
    return READ_ONLY.get(template, frozenset())
