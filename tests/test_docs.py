"""The documentation stays with the code: the README is short and starts with the two set-up
commands; nothing points outside the repository; every page a message names exists; every
command, option and route is documented (and every route is in the OpenAPI documents)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from docker_variant import openapi
from docker_variant.proxy import create_app as proxy_app

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
BIN = Path(sys.executable).parent
TEXT = (".py", ".md", ".html", ".toml", ".json", ".yml", ".yaml")


def _texts(*roots: Path) -> list[Path]:
    found = []
    for root in roots:
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        found += [p for p in paths if p.suffix in TEXT and "__pycache__" not in p.parts]
    return found


DOCS_SITE = "https://docker-variant.github.io/docker-variant/"  # mkdocs.yml's site_url


def _help(*argv: str) -> str:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=True).stdout


def test_readme_is_short_and_starts_with_the_two_set_up_commands() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    first_block = "\n".join(lines[: lines.index("```", lines.index("```sh") + 1)])
    assert "bash scripts/demo" in first_block and "bash scripts/test" in first_block
    assert (REPO / "scripts/demo").is_file() and (REPO / "scripts/test").is_file()
    # links are absolute, as an index page (PyPI) shows them: each names a page of docs/
    assert not re.findall(r"\]\((?!https?://)", "\n".join(lines))
    for page in re.findall(re.escape(DOCS_SITE) + r"([^)#]*)", "\n".join(lines)):
        source = DOCS / (page.rstrip("/") + ".md") if page else DOCS / "index.md"
        assert source.is_file() or (DOCS / page / "index.md").is_file(), page


def test_nothing_points_outside_the_repository() -> None:
    outside = re.compile(r"SPEC section|SPEC\.md|\bSPEC \d|shared/")
    for path in _texts(REPO / "src", DOCS, REPO / "README.md", REPO / "bench/README.md"):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            assert not outside.search(line), f"{path.relative_to(REPO)}:{number}: {line.strip()}"


def test_every_docs_page_the_code_names_exists() -> None:
    named = re.compile(r"docs(?:/|: )reference/([a-z-]+)(?:\.md)?")
    for path in _texts(REPO / "src"):
        for page in named.findall(path.read_text()):
            assert (DOCS / "reference" / f"{page}.md").is_file(), (path, page)


def _commands(help_text: str) -> list[str]:
    """The commands a typer or argparse --help lists."""
    table = help_text.split("Commands", 1)[1] if "Commands" in help_text else help_text
    return re.findall(r"^(?:│ |    )([a-z][a-z0-9-]+)\s{2,}", table, re.MULTILINE)


def test_every_command_and_option_is_in_the_cli_reference() -> None:
    reference = (DOCS / "reference/cli.md").read_text()
    commands = _commands(_help(str(BIN / "docker-variant"), "--help"))
    assert {"providers", "pull", "publish", "k8s"} <= set(commands)
    for command in commands:
        assert f"`{command}" in reference, command
    for command in _commands(_help(str(BIN / "docker-variant"), "k8s", "--help")):
        assert f"`k8s {command}" in reference, command
    programs = [("variant-proxy",), ("variant-scheduler", "serve"), ("variant-scheduler", "agent"),
                ("variant-scheduler", "what-if"), ("docker-variant",)]  # fmt: skip
    programs += [("docker-variant", c) for c in commands if c != "k8s"]
    programs += [
        ("docker-variant", "k8s", c) for c in ("claim", "gang", "node-labels", "containerd-hosts")
    ]
    reference += (DOCS / "reference/kubernetes.md").read_text()
    for program in programs:
        text = _help(str(BIN / program[0]), *program[1:], "--help")
        for option in set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]+", text)) - {"--help"}:
            assert re.search(rf"{option}(?![a-z0-9-])", reference), (program, option)


def _scheduler_routes() -> set[tuple[str, str]]:
    import tempfile

    from docker_variant.scheduler import Store
    from docker_variant.scheduler.app import create_app

    with tempfile.TemporaryDirectory() as tmp:  # the routes only: nothing is called
        store = Store.open(f"sqlite:///{tmp}/routes.db")
        app = create_app(store)
        store.close()
    return {
        (route.path, method)
        for route in app.routes
        for method in getattr(route, "methods", None) or ()
        if method != "HEAD"
    }


def test_every_scheduler_route_is_documented() -> None:
    document = json.loads(openapi.document("scheduler"))
    page = (DOCS / "reference/scheduler-api.md").read_text()
    routes = _scheduler_routes()
    assert ("/v1/placements/{placement_id}/replace", "POST") in routes
    for path, method in routes:
        if path.startswith("/ui"):  # HTML and its form, for browsers: not an API
            assert f"`{path}`" in page or f"{method} {path}" in page, path
            continue
        assert method.lower() in document["paths"].get(path, {}), (method, path)
        shown = re.sub(r"\{[a-z_]+\}", "{id}", path).replace("{id}", r"\{[a-z_]+\}")
        assert re.search(rf"`{method} {shown}", page) or re.search(rf"`{shown}", page), path
    documented = {
        (p, m.upper()) for p, ops in document["paths"].items() for m in ops if m != "parameters"
    }
    assert documented == {(p, m) for p, m in routes if not p.startswith("/ui")}
    # and the module's own table, which a reader of the code sees first
    from docker_variant.scheduler import app

    table = re.sub(r"\{[a-z_]+\}", "{id}", app.__doc__ or "")
    for path, _ in routes:
        shown = re.escape(re.sub(r"\{[a-z_]+\}", "{id}", path))
        assert re.search(shown + r"[`\[]", table), path  # a query may follow: [?state=...]


@pytest.mark.parametrize("path", ["/healthz", "/metrics", "/_notify", "/openapi.json"])
def test_every_proxy_route_of_its_own_is_documented(path: str) -> None:
    app = proxy_app("http://127.0.0.1:1")
    assert path in {getattr(route, "path", None) for route in app.routes}
    assert path in json.loads(openapi.document("proxy"))["paths"]
    assert (
        f"`{path}" in (DOCS / "reference/proxy-api.md").read_text()
        or f"{path}`" in (DOCS / "reference/proxy-api.md").read_text()
    )
