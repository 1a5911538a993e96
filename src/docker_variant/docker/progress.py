"""Progress bars (rich) fed by the Docker engine's events: per layer for pulls and pushes,
per build for a matrix."""

from __future__ import annotations

import re
from types import TracebackType
from typing import Any, Self

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TransferSpeedColumn,
)
from rich.text import Text

from docker_variant.docker.events import HEADER_STATUSES, is_done, layer_status
from docker_variant.safetext import safe_text

__all__ = ["PROGRESS_FROM", "BuildProgress", "LayerProgress", "RichMeter"]

#: Below this an image reads in about a second: no progress bar (``RichMeter``).
PROGRESS_FROM = 64 << 20


class _Bars:
    """A context manager that shows ``self._progress`` while it is entered."""

    _progress: Progress

    def __enter__(self) -> Self:
        self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()


class _SizedOnly(ProgressColumn):
    """``inner``, left blank for a layer whose size the engine never said (one that already
    exists shows no made-up "1/1 bytes ?")."""

    def __init__(self, inner: ProgressColumn) -> None:
        super().__init__()
        self._inner = inner

    def render(self, task: Task) -> RenderableType:
        return self._inner.render(task) if task.fields.get("sized") else Text("")


class LayerProgress(_Bars):
    """A context manager whose ``__call__`` takes one engine event."""

    def __init__(self, action: str, console: Console | None = None, enabled: bool = True) -> None:
        self.action = action
        self.events: list[dict[str, Any]] = []
        self._tasks: dict[str, TaskID] = {}
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            _SizedOnly(DownloadColumn()),
            _SizedOnly(TransferSpeedColumn()),
            TextColumn("{task.fields[status]}"),
            console=console or Console(stderr=True),
            disable=not enabled,
        )

    def __call__(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        found = layer_status(event)
        if found is None:
            return
        layer, status = found
        shown = safe_text(status, markup=True)  # the engine relays registry text
        if layer not in self._tasks:
            if status.startswith(HEADER_STATUSES):
                return
            self._tasks[layer] = self._progress.add_task(
                safe_text(f"{self.action} {layer[:12]}", markup=True),
                total=None,
                status=shown,
                sized=False,
            )
        task = self._tasks[layer]
        detail = event.get("progressDetail") or {}
        total, current = detail.get("total"), detail.get("current")
        if isinstance(total, int) and total > 0 and isinstance(current, int):
            self._progress.update(task, total=total, completed=current, status=shown, sized=True)
        elif is_done(status):
            known = self._progress.tasks[task].total
            self._progress.update(task, total=known or 1, completed=known or 1, status=shown)
        else:
            self._progress.update(task, status=shown)


class RichMeter:
    """A bar of bytes read (``contents``' ``Meter``), shown only for large images and only
    on a terminal."""

    def __init__(self, description: str, console: Console, enabled: bool = True) -> None:
        self._enabled = enabled and console.is_terminal  # no bar in logs and pipes
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            console=console,
            transient=True,
        )
        self._description = safe_text(description, markup=True)
        self._task: TaskID | None = None  # set once the bar is shown

    def total(self, size: int | None) -> None:
        if not self._enabled or (size is not None and size < PROGRESS_FROM):
            return
        if self._task is None:
            self._task = self._progress.add_task(self._description, total=size)
            self._progress.start()
        else:
            self._progress.update(self._task, total=size)

    def advance(self, size: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, size)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._progress.stop()


class BuildProgress(_Bars):
    """One bar per build (a matrix entry), advanced by the builder's ``Step i/n`` lines."""

    _STEP = re.compile(r"Step (\d+)/(\d+)")

    def __init__(self, names: list[str], console: Console | None = None, enabled: bool = True):
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            console=console or Console(stderr=True),
            disable=not enabled,
        )
        self._tasks = {
            name: self._progress.add_task(
                safe_text(f"build {name}", markup=True), total=None, status="waiting"
            )
            for name in names
        }

    def event(self, name: str, event: dict[str, Any]) -> None:
        line = str(event.get("stream", "")).strip()
        match = self._STEP.match(line)
        if match:
            step, total = int(match[1]), int(match[2])
            self._progress.update(
                self._tasks[name], total=total, completed=step - 1, status=f"step {step}/{total}"
            )

    def done(self, name: str, status: str) -> None:
        task = self._tasks[name]
        known = self._progress.tasks[task].total or 1
        self._progress.update(
            task, total=known, completed=known, status=safe_text(status, markup=True)
        )
