"""Progress of prebuild and verify --rebuild (mono_jit.progress.Progress) for a person or a log.

On a terminal: a rich bar (with -v, also a line per finished job above it). Off a terminal (a
docker build log, CI): one line per finished job, '[n/N] event label'. With -q: failures only.
Failures are always printed, one line each."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .options import verbosity

FAILED = "failed"


class Reporter:
    """A context manager that is a mono_jit Progress for the duration of one run."""

    def __init__(self, what: str, transient: bool = False) -> None:
        self.console = Console(stderr=True)
        self.level = verbosity()
        self.what = what
        self.done = 0
        self.total: int | None = None
        show_bar = self.console.is_terminal and self.level >= 0
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=self.console, transient=transient) if show_bar else None
        self.task = self.bar.add_task(what, total=None) if self.bar is not None else None

    def __enter__(self) -> "Reporter":
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.bar is not None:
            self.bar.stop()

    def planned(self, total: int) -> None:
        self.total = total
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, total=total)

    def finished(self, event: str, label: str, detail: str) -> None:
        self.done += 1
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, advance=1, description=f"{event} {label}")
        if event == FAILED:  # one line, whatever the verbosity, markup-free
            self.console.print(f"[red]failed[/red] {escape(detail)}", soft_wrap=True)
        elif self.level >= 1 or (self.bar is None and self.level >= 0):
            when = f" {detail}" if detail and self.level >= 1 else ""
            self.console.print(f"[{self.done}/{self.total or '?'}] {event} {label}{when}", soft_wrap=True,
                               markup=False, highlight=False)
