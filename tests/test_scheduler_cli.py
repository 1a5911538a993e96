"""``variant-scheduler``: argument errors (exit 2), a dead database (exit 3), a real serve."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import httpx
import pytest

import devstack
from docker_variant.scheduler.__main__ import main
from test_scheduler_support import H200_R570, INDEX, agent_body, free_port


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "the following arguments are required: COMMAND"),
        (["start"], "invalid choice: 'start'"),
        (["serve", "--db", "mysql://u@h/db"], "'mysql' is not supported"),
        (["serve", "--db", "::nonsense"], "invalid database URL '::nonsense'"),
        (["serve", "--db", "sqlite://"], "an in-memory SQLite database is private"),
        (
            ["serve", "--db", "sqlite:////no/such/dir/x.db"],
            "directory '/no/such/dir' does not exist",
        ),
        (["serve", "--db", "postgresql+psycopg2://u:pw@h/db"], "use postgresql+psycopg://"),
        (["serve", "--listen", "localhost"], "invalid listen address 'localhost'"),
        (["serve", "--listen", "127.0.0.1:70000"], "port '70000' is not a number 0-65535"),
        (["serve", "--agent-ttl", "soon"], "agent TTL 'soon' is not a number"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    os.chdir(tmp_path)  # the default database is ./variant-scheduler.db
    code, err = run_main(argv, capsys)
    assert code == 2
    assert err.count("\n") == 1 and message in err, err
    assert "pw" not in err


def test_busy_port_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        db = f"sqlite:///{tmp_path / 's.db'}"
        code, err = run_main(["serve", "--db", db, "--listen", f"127.0.0.1:{port}"], capsys)
    assert code == 2
    assert err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err


def test_unreachable_database_exits_3_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"postgresql://scheduler:secret@127.0.0.1:{free_port()}/scheduler"
    code, err = run_main(["serve", "--db", url], capsys)
    assert code == 3
    assert err.count("\n") == 1, err
    assert "database postgresql+psycopg://scheduler:***@127.0.0.1" in err
    assert "Connection refused" in err and "secret" not in err


def test_serve_answers_and_stops_on_sigterm(tmp_path: Path) -> None:
    scheduler = devstack.start_scheduler(tmp_path)
    try:
        url = scheduler.url
        httpx.put(f"{url}/v1/agents/node", json=agent_body(H200_R570, 2)).raise_for_status()
        body = {"index": INDEX, "nodes": 1, "devices_per_node": 2}
        placed = httpx.post(f"{url}/v1/placements", json=body)
        assert placed.status_code == 201 and placed.json()["variant"] == "cu128"
    finally:
        scheduler.process.send_signal(signal.SIGTERM)
        scheduler.process.wait(timeout=20)
    # uvicorn shuts down gracefully, then re-raises SIGTERM, as servers conventionally do
    assert scheduler.process.returncode in (0, -signal.SIGTERM), scheduler.log_tail()
    assert "Traceback" not in scheduler.log_tail(100_000)
    db = tmp_path / "scheduler.db"
    assert db.exists()


def test_the_command_line_names_the_database_default_without_loading_it() -> None:
    """``variant-scheduler --help`` loads no server (SQLAlchemy, Starlette), and nothing
    beyond argparse that a command loads when it runs (typing, dataclasses, logging,
    pathlib, socket, json, ssl, httpx, shutil: 45 ms of its start-up): the default database URL it
    prints is written out there, and agrees with the database module's."""
    import subprocess
    import sys

    from docker_variant.scheduler import __main__ as command
    from docker_variant.scheduler import store
    from docker_variant.scheduler.database import DEFAULT_DB_URL

    assert command.DEFAULT_DB_URL == DEFAULT_DB_URL
    assert command.DEFAULT_MAX_PLACEMENTS == store.DEFAULT_MAX_PLACEMENTS
    assert command.DEFAULT_MAX_REQUEST == store.DEFAULT_MAX_REQUEST
    probe = (
        "import sys; from docker_variant.scheduler.__main__ import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('sqlalchemy', 'starlette', 'uvicorn', 'jinja2', 'typing', "
        "'dataclasses', 'logging', 'pathlib', 'socket', 'json', 'ssl', 'httpx', 'shutil') "
        "if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert loaded.stdout.strip().splitlines()[-1] == "[]", loaded.stdout + loaded.stderr


@pytest.mark.parametrize("columns", ["60", "200", "0", "-5", "abc"])
def test_the_help_width_follows_argparses_own_rule(
    monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    """The help formatter computes the width as argparse does through shutil (``$COLUMNS``
    when positive, else the terminal, else 80; less 2), without importing shutil."""
    import argparse

    from docker_variant.server.options import _HelpFormatter

    monkeypatch.setenv("COLUMNS", columns)
    description = " ".join(["a word that wraps"] * 40)

    def rendered(formatter: type[argparse.HelpFormatter]) -> str:
        parser = argparse.ArgumentParser("prog", description=description, formatter_class=formatter)
        return parser.format_help()

    assert rendered(_HelpFormatter) == rendered(argparse.HelpFormatter)
