"""What the engine's pull and push events say about each layer, and ``LayerLines``: one
plain line per layer once it is done, for logs and pipes (``progress`` draws the same
events as rich bars on a terminal)."""

from __future__ import annotations

from types import TracebackType
from typing import IO, Any, Self, TextIO

from docker_variant.safetext import safe_text

__all__ = [
    "DONE_STATUSES",
    "HEADER_STATUSES",
    "BuildLines",
    "LayerLines",
    "is_done",
    "layer_status",
]

#: A layer with one of these statuses has nothing more to do.
DONE_STATUSES = (
    "Pull complete",
    "Already exists",
    "Pushed",
    "Layer already exists",
    "Mounted from",
)
#: The first line of a pull or push, whose ``id`` is the tag, not a layer.
HEADER_STATUSES = ("Pulling from", "The push refers to")


def layer_status(event: dict[str, Any]) -> tuple[str, str] | None:
    """``(layer id, status)`` of an event about a layer; ``None`` for the others (a digest,
    the final status, a tag's line without a status)."""
    layer = event.get("id")
    status = str(event.get("status", ""))
    if not layer or (":" in str(layer) and not status):
        return None
    return str(layer), status


def is_done(status: str) -> bool:
    return status.startswith(DONE_STATUSES)


class _PlainLines:
    """Lines written to a log or a pipe, each made safe to print (the engine relays registry
    text), the stream flushed when the context ends."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def _write(self, text: str) -> None:
        self._stream.write(safe_text(text, markup=False) + "\n")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stream.flush()


class LayerLines(_PlainLines):
    """A context manager whose ``__call__`` takes one engine event and writes
    ``<action> <image> layer <layer>: <status>`` to ``stream`` when a layer is done, once
    per layer (the engine relays registry text: shown safely). The image is named: a log of
    ``build --push`` holds the layers of several images, many of them alike."""

    def __init__(self, action: str, stream: TextIO, image: str | None = None) -> None:
        super().__init__(stream)
        self.action = f"{action} {image} layer" if image else action
        self._done: set[str] = set()

    def __call__(self, event: dict[str, Any]) -> None:
        found = layer_status(event)
        if found is None:
            return
        layer, status = found
        if layer in self._done or not is_done(status):
            return
        self._done.add(layer)
        self._write(f"{self.action} {layer[:12]}: {status}")


class BuildLines(_PlainLines):
    """``progress.BuildProgress`` in a log or a pipe: ``build <image>: <status>`` once an
    image is done, and no bars."""

    def event(self, name: str, event: dict[str, Any]) -> None:
        """A build's step: a log gets only the outcome."""

    def done(self, name: str, status: str) -> None:
        self._write(f"build {name}: {status}")
