"""The one progress helper: rich bars on stderr while a person watches, lines in a log.

- `progress_bars(enabled)`: the bars of a run (many tasks, `add_task` / `advance` /
  `update`); on a terminal rich bars, in a log one line per step at most once a second.
- `task_bar(description, total, enabled=...)`: one transient bar for one computation,
  with `advance(n)` and `update(done, total)`.
- `track(items, description, enabled=...)`: items, with a transient bar while they are
  consumed.
- `status(text, enabled=...)`: a spinner with elapsed time, for work without a count.

Each of them, enabled where nobody watches (stderr is not a terminal: a log, a batch
job), writes plain lines instead: one per step at most once a second, and the last.
- `watching()`: a person is watching (stderr is a terminal, or a Jupyter kernel runs).

Everything goes to stderr, so that stdout keeps only what a command prints as output.
rich is imported when a bar is drawn.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

T = TypeVar("T")


def watching() -> bool:
    """A person is watching: stderr is a terminal, or the code runs in a Jupyter kernel."""
    return bool(getattr(sys.stderr, "isatty", lambda: False)()) or "ipykernel" in sys.modules


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


class _Bar:
    """One task of a rich `Progress` (or nothing, when bars are off)."""

    def __init__(self, progress: Any = None, task: Any = None) -> None:
        self._progress, self._task = progress, task

    def advance(self, n: float = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def update(self, done: float, total: float | None = None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done, total=total)


@contextmanager
def task_bar(
    description: str, total: float | None = None, *, enabled: bool = True
) -> Iterator[_Bar]:
    """A transient bar (description, bar, done/total, time left) while the block runs."""
    if not enabled:
        yield _Bar()
        return
    if not watching():  # a log: one line per step (at most one a second), not a bar
        lines = _Lines(sys.stderr)
        yield _Bar(_LinesAsProgress(lines), lines.add_task(description, total=total))
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        transient=True,
        console=_console(),
    ) as progress:
        yield _Bar(progress, progress.add_task(description, total=total))


def track(
    items: Iterable[T], description: str, *, enabled: bool = True, total: int | None = None
) -> Iterable[T]:
    """`items`, with a transient bar while they are consumed (`total`: len(items) if sized)."""
    if not enabled:
        return items
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    if not watching():  # a log: one line per step (at most one a second), not a bar
        return _tracked_lines(items, description, total)
    from rich.progress import track as rich_track

    return rich_track(
        items, description=description, total=total, transient=True, console=_console()
    )


def _tracked_lines(items: Iterable[T], description: str, total: int | None) -> Iterator[T]:
    lines = _Lines(sys.stderr)
    task = lines.add_task(description, total=total)
    done = 0
    for item in items:
        yield item
        done += 1
        lines.update(task, completed=done)
    if total is None or done < total:  # the last line says how many there were
        lines.tasks[task].update(total=done, done=-1)
        lines.update(task, completed=done)


def status(text: str, *, enabled: bool = True) -> AbstractContextManager[Any]:
    """A spinner with `text` on stderr while the block runs (in a log: a line with its time
    when it ends, and a line when it starts if it is still running after
    `STATUS_START_LINE_S`, so that a step refused at once leaves only its error)."""
    if not enabled:
        return nullcontext()
    return _console().status(text) if watching() else _status_lines(text)


STATUS_START_LINE_S = 3.0


@contextmanager
def _status_lines(text: str) -> Iterator[None]:
    import threading

    label = text.rstrip(" .…")
    start = time.monotonic()
    timer = threading.Timer(
        STATUS_START_LINE_S, lambda: print(f"{label} …", file=sys.stderr, flush=True)
    )
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
    print(f"{label}: done in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)


class _Quiet:
    """Progress stand-in when bars are off."""

    def add_task(self, *_: Any, **__: Any) -> int:
        return 0

    def advance(self, *_: Any) -> None:
        pass

    def update(self, *_: Any, **__: Any) -> None:
        pass


class _Lines:
    """Progress for logs (stderr is not a terminal): one line per step, with rate and ETA,
    at most one a second per task except the last, so batch-job logs show where a run is."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.tasks: dict[int, dict[str, Any]] = {}

    def add_task(self, label: str, total: float | None = None, **_: Any) -> int:
        self.tasks[len(self.tasks)] = {
            "label": label,
            "total": total,
            "done": 0.0,
            "start": time.monotonic(),
            "shown": -1.0,
        }
        return len(self.tasks) - 1

    def advance(self, task: int, k: float = 1) -> None:
        self.update(task, completed=self.tasks[task]["done"] + k)

    def update(
        self, task: int, *, completed: float | None = None, total: float | None = None
    ) -> None:
        t = self.tasks[task]
        if total is not None:
            t["total"] = total
        if completed is None or (completed == t["done"] and t["shown"] >= 0):
            return
        t["done"] = completed
        now = time.monotonic()
        finished = t["total"] is not None and completed >= t["total"]
        if not finished and now - t["shown"] < 1.0:
            return
        t["shown"] = now
        elapsed = now - t["start"]
        if t["total"]:
            eta = elapsed / completed * (t["total"] - completed) if completed else float("nan")
            line = (
                f"{t['label']}: {completed:g}/{t['total']:g} "
                f"({100 * completed / t['total']:.0f}%) elapsed {elapsed:.0f} s, eta {eta:.0f} s"
            )
        else:
            line = f"{t['label']}: {completed:g} so far, elapsed {elapsed:.0f} s"
        print(line, file=self.stream, flush=True)


class _LinesAsProgress:
    """`_Lines` behind rich's `Progress` methods that `_Bar` calls."""

    def __init__(self, lines: _Lines) -> None:
        self.lines = lines

    def advance(self, task: int, n: float = 1) -> None:
        self.lines.advance(task, n)

    def update(self, task: int, *, completed: float, total: float | None = None) -> None:
        self.lines.update(task, completed=completed, total=total)


@contextmanager
def progress_bars(enabled: bool) -> Iterator[Any]:
    """Progress of a run on stderr: rich bars on a terminal, one line per step in a log."""
    if not enabled:
        yield _Quiet()
        return
    if not sys.stderr.isatty():
        yield _Lines(sys.stderr)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        "eta",
        TimeRemainingColumn(),
        console=_console(),
    ) as bar:
        yield bar
