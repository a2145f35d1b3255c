"""K1's task tables: which weight tile, K steps and row each of its stages' tasks and waves take.

Pure + - * // % and comparisons, as the shared addressing (templates/addressing.py): the kernel
calls these on FlyDSL values, the CPU tests (tests/templates/k1/test_k1_addressing.py, tests/templates/k1/test_k1_bounds.py)
on Python ints.
"""

from __future__ import annotations

from ...deepseek_v4 import Q_LORA
from ..addressing import split_steps
from ..geometry import TILE_K, TILE_N, WAVES
from .layout import S3_PART_STEPS, S3_TILES


def s3_task(task):
    """(first weight row of the tile, K half) of S3 task `task`."""
    return (task % S3_TILES) * TILE_N, task // S3_TILES


def s3_steps(part, wave):
    """(K step, keep) of one wave in K half `part`: 28 steps over 8 waves are w, w + 8, w + 16
    for every wave and 24 + w for waves 0..3; waves 4..7 compute 24 + w - 4 again and drop it."""
    return split_steps(part * S3_PART_STEPS, S3_PART_STEPS, wave)


S5_WAVES_PER_TILE = WAVES // 2
S5_STEPS = Q_LORA // TILE_K // S5_WAVES_PER_TILE  # 3


def s5_tile(task, wave):
    """(first weight row, first K step) of one wave of S5 task `task`: two 16-row tiles per
    task, four waves per tile, three consecutive K steps per wave."""
    return (task * 2 * TILE_N + (wave // S5_WAVES_PER_TILE) * TILE_N,
            (wave % S5_WAVES_PER_TILE) * S5_STEPS)
