"""The mHC seam's two stages as schedule-table pieces, stated once for K1 and K2 (pure Python).

The fold stage's tasks are (row group of 16, column chunk of 128) pairs, numbered chunks
innermost: K1's S1 (the attention seam's fold), K2's S7 (the all-reduce and the FFN seam's
fold) and S19 (the MoE all-reduce, over the same tasks). The gate stage's task is a row, which
waits on every column chunk of its group: K1's S2, K2's S8. The kernels call these on FlyDSL
values, the protocol model and the tests on ints (geometry.py holds the split's figures).
"""

from __future__ import annotations

import math
from typing import Any

from .geometry import SEAM_CHUNKS, SEAM_GROUP


def groups(rows: int) -> int:
    """Row groups of a bucket of `rows`."""
    return math.ceil(rows / SEAM_GROUP)


def fold_tasks(lay: Any) -> int:
    """The fold stage's task count (a `Stage.tasks`): every (row group, column chunk)."""
    return groups(lay.rows) * SEAM_CHUNKS


def fold_task(task):
    """(row group, column chunk) of fold task `task`."""
    return task // SEAM_CHUNKS, task % SEAM_CHUNKS


def fold_row(lay: Any, task):
    """The first row of fold task `task`'s group (its `Stage.row_of`: past m, the task is a pad)."""
    return fold_task(task)[0] * SEAM_GROUP


def gate_awaits(lay: Any, row, m, data: Any) -> tuple:
    """A gate row's wait on the fold stage (a `Wait.flags`): every column chunk of its group."""
    return (row // SEAM_GROUP) * SEAM_CHUNKS, SEAM_CHUNKS
