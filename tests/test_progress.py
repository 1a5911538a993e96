"""The pull and push bars as a person sees them, from the engine's own event shapes."""

from __future__ import annotations

import io

from rich.console import Console

from docker_variant.docker.progress import LayerProgress


def _screen(events: list[dict[str, object]]) -> str:
    console = Console(file=io.StringIO(), width=120, force_terminal=True, record=True)
    with LayerProgress("pull", console=console) as bars:
        for event in events:
            bars(event)
    return console.export_text()


def test_a_layer_that_already_exists_shows_no_made_up_size() -> None:
    screen = _screen([{"status": "Already exists", "id": "621222cd8430"}])
    assert "pull 621222cd8430" in screen and "Already exists" in screen
    assert "1/1 bytes" not in screen and "?" not in screen


def test_a_downloading_layer_shows_its_size() -> None:
    detail = {"current": 50_000_000, "total": 100_000_000}
    screen = _screen(
        [
            {"status": "Downloading", "id": "5d0aeceef7ee", "progressDetail": detail},
            {"status": "Pull complete", "id": "5d0aeceef7ee", "progressDetail": {}},
        ]
    )
    assert "100.0/100.0 MB" in screen and "Pull complete" in screen
