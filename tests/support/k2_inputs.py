"""K2's test world: the package's (mono_jit/selfcheck/k2_world.py, which `mono-jit selftest` uses
too), under the name the tests import it by, with the widths it is built on under the tests' short
names (from their homes: mono_jit/deepseek_v4.py, templates/k2/)."""

from mono_jit.deepseek_v4 import EPS, HEADS, NOPE  # noqa: F401
from mono_jit.deepseek_v4 import HEAD_DIM as D, HIDDEN as H, OUTPUT_GROUPS as GROUPS  # noqa: F401
from mono_jit.selfcheck.k2_world import (  # noqa: F401
    COMP_BLOCK, COMP_PAGES, COMP_STRIDE, KV_GAIN, KV_GAIN_BITS, LOCAL, PAD, POISON_COMP, POISON_SWA, POSITIONS,
    SWA_BLOCK, SWA_PAGES, SWA_STRIDE, TP, FullWeights, World, full_weights, paged_cache, random_fp8, scale_codes,
    shard, world)
from mono_jit.templates.k2.attention_addressing import GROUP_K  # noqa: F401
from mono_jit.templates.k2.attention_layout import O_LORA  # noqa: F401
