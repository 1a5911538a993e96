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


def test_engine_text_with_markup_and_terminal_escapes_is_shown_as_it_is() -> None:
    # a registry's error text relayed by the engine, and a layer id it made up
    screen = _screen(
        [
            {"status": "denied: [link=http://x]a[/link] \x1b[31m\x07[bold", "id": "[/]\x1b]0;t"},
        ]
    )
    assert "denied: [link=http://x]a[/link] \\x1b[31m\\x07[bold" in screen
    assert "pull [/]\\x1b]0;t" in screen
    assert "\x1b" not in screen and "\x07" not in screen
