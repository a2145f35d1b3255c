"""The words of a persistent launch's sync area, as numbers (pure Python: layouts, the runner and
the tests read them without FlyDSL). sync_device.py is the FlyDSL code that reads and writes these
words on the device; the two are separate so nothing that only needs the numbers imports FlyDSL."""

EPOCH_WORD = 0  # the tag of the last launch that ended normally
EXIT_WORD = 1  # CTAs of the running launch that have left
ARRIVE_WORD = 2  # CTAs of the running launch that have started
FIRST_FLAG = 3  # task flags follow
