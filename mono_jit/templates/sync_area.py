"""The words of a persistent launch's sync area (pure Python: layouts, the runner and the tests
read them without FlyDSL; templates/_sync.py is the device side)."""

EPOCH_WORD = 0  # the tag of the last launch that ended normally
EXIT_WORD = 1  # CTAs of the running launch that have left
ARRIVE_WORD = 2  # CTAs of the running launch that have started
FIRST_FLAG = 3  # task flags follow
