"""The private names of the standard library and of dependencies this package relies on,
where no public API does the job (each use says why): these tests fail when one of them
disappears or stops doing what the package counts on, instead of the package silently
losing the speed it bought with it. ``logging._srcfile`` is not among them: the access
log skips the caller's look-up through public API (``server.logs.log_fields``)."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import docker_variant
from docker_variant.server.logs import JsonFormatter, log_fields

PACKAGE = Path(docker_variant.__file__).parent


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.strip()


def test_httpx_imports_its_command_line_as_httpx_main_and_falls_back_without_it() -> None:
    """entry.UNUSED_OPTIONAL_IMPORTS names ``httpx._main``: httpx must import exactly that
    module (when rich and click are installed), and fall back to a stub when it cannot."""
    plain = _run("import sys, httpx; print('httpx._main' in sys.modules, 'click' in sys.modules)")
    assert plain == "True True"
    skipped = _run(
        "import sys; from docker_variant.entry import _skip_unused_optional_imports\n"
        "_skip_unused_optional_imports(); import httpx\n"
        "print(sys.modules.get('httpx._main'), 'click' in sys.modules, callable(httpx.main))"
    )
    assert skipped == "None False True"


def test_atexit_run_exitfuncs_runs_the_handlers_before_a_fast_exit(tmp_path: Path) -> None:
    """entry._exit_now runs the atexit handlers through ``atexit._run_exitfuncs`` and then
    leaves with ``os._exit``: a handler's work must still be done."""
    marker = tmp_path / "ran"
    code = (
        "import atexit, pathlib\n"
        f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'yes')\n"
        "from docker_variant.entry import _exit_now\n"
        "_exit_now(0)\n"
    )
    _run(code)
    assert marker.read_text() == "yes"


def test_no_other_private_name_of_the_standard_library_is_used() -> None:
    used = {
        name
        for path in PACKAGE.rglob("*.py")
        for name in ("logging._srcfile", "atexit._run_exitfuncs", "httpx._main")
        if name in path.read_text(encoding="utf-8")
    }
    assert used == {"atexit._run_exitfuncs", "httpx._main"}


def test_log_fields_writes_the_fields_without_the_callers_file() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("docker_variant.test_log_fields")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    records: list[logging.LogRecord] = []
    logger.addFilter(lambda record: records.append(record) or True)
    try:
        log_fields(logger, logging.DEBUG, "request", {"status": 500})  # below the level
        log_fields(logger, logging.INFO, "request", {"status": 200})
    finally:
        logger.removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    assert json.loads(line)["status"] == 200
    assert records[0].pathname == "(unknown file)" and records[0].lineno == 0
