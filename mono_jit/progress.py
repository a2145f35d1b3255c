"""How long-running library calls (prebuild, verify with rebuild) report progress to their caller."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Told the number of jobs once planned, then each job as it finishes: `event` is what
    happened ("hit", "compiled", "failed", "identical", "differs"), `label` names the job
    (template and spec) and `detail` is a time or an error."""

    def planned(self, total: int) -> None: ...

    def finished(self, event: str, label: str, detail: str) -> None: ...


class Silent:
    """Progress that shows nothing (the default of the Python API)."""

    def planned(self, total: int) -> None:
        pass

    def finished(self, event: str, label: str, detail: str) -> None:
        pass
