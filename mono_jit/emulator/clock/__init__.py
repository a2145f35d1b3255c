"""The emulated MI355X's clock: a cycle-approximate timing model run as a second pass over an
event trace the functional run records (`trace.py`), with one parameter table (`params.py`), the
timing pass (`timing.py`) and its per-launch outputs (`report.py`)."""
