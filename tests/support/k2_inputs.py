"""K2's test world: the package's (mono_jit/selfcheck/k2_world.py, which `mono-jit selftest` uses
too), under the name the tests import it by."""

from mono_jit.selfcheck.k2_world import (  # noqa: F401
    COMP_BLOCK, COMP_PAGES, COMP_STRIDE, D, EPS, GROUP_K, GROUPS, HEADS, KV_GAIN, KV_GAIN_BITS, LOCAL, NOPE, O_LORA, PAD,
    POISON_COMP, POISON_SWA, POSITIONS, SWA_BLOCK, SWA_PAGES, SWA_STRIDE, TP, FullWeights, H, World, full_weights,
    paged_cache, random_fp8, scale_codes, shard, world)
