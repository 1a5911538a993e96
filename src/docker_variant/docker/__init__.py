"""The Docker engine side of ``docker variant pull`` and ``push``.

- ``engine``: the Engine API client (httpx over the engine's socket);
- ``ops``: pull and push around engine calls (selection, label checks, tags);
- ``events``: what the engine's pull and push events say, and plain lines of them;
- ``progress``: rich progress bars of those events, for a terminal;
- ``context``: a build context as a tar archive.

Nothing is imported until it is asked for (PEP 562): ``pull --dry-run`` needs no engine
client, and a pull whose output is a pipe needs no rich.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from docker_variant.lazy import lazy_attributes

if TYPE_CHECKING:
    from docker_variant.docker.engine import Engine, EngineError, engine_host
    from docker_variant.docker.events import LayerLines
    from docker_variant.docker.ops import (
        PullResult,
        check_push_labels,
        pull_candidate,
        push_image,
    )
    from docker_variant.docker.progress import BuildProgress, LayerProgress

# Each public name and the module that defines it.
_HOMES = {
    "BuildProgress": "progress",
    "Engine": "engine",
    "EngineError": "engine",
    "LayerLines": "events",
    "LayerProgress": "progress",
    "PullResult": "ops",
    "check_push_labels": "ops",
    "engine_host": "engine",
    "pull_candidate": "ops",
    "push_image": "ops",
}

__all__ = [
    "BuildProgress",
    "Engine",
    "EngineError",
    "LayerLines",
    "LayerProgress",
    "PullResult",
    "check_push_labels",
    "engine_host",
    "pull_candidate",
    "push_image",
]


__getattr__ = lazy_attributes(__name__, _HOMES)
