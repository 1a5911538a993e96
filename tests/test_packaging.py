"""One version, single-sourced, and a wheel that holds every file the package reads
(scripts/wheel-smoke builds and installs the wheel itself; these are the fast checks)."""

from __future__ import annotations

import fnmatch
import tomllib
from importlib.metadata import metadata, version
from pathlib import Path

import docker_variant

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PACKAGE = REPO / "src/docker_variant"


def test_the_version_has_one_home() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    dynamic = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "docker_variant.__version__"}
    assert version("docker-variant") == docker_variant.__version__


def test_every_data_file_of_the_package_is_package_data() -> None:
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["docker_variant"]
    data = [
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    ]
    assert "openapi/scheduler.json" in data and "py.typed" in data
    for name in data:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name


def test_metadata_a_package_index_shows() -> None:
    shown = metadata("docker-variant")
    assert shown["License-Expression"] == PYPROJECT["project"]["license"]
    classifiers = shown.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert shown["Requires-Python"] == ">=3.11"
    assert "pep825" in (shown["Keywords"] or "")
    assert shown.get_all("Project-URL")


def test_the_oldest_constraints_pin_every_lower_bound() -> None:
    """``constraints/oldest.txt`` (what ``scripts/test-oldest`` installs) pins each of the
    package's own requirements, the extras' too, at its lower bound, and nothing else: a floor
    raised or lowered in pyproject.toml without the pin would test versions nobody asked for."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    own = (*project["dependencies"], *extras["proxy"], *extras["scheduler"], *extras["kubernetes"])
    requirements = [Requirement(text) for text in own]
    floors: dict[str, Version] = {}
    for requirement in requirements:
        lower = [s.version for s in requirement.specifier if s.operator in (">=", "~=", "==")]
        assert len(lower) == 1, f"{requirement}: one lower bound"
        floors[canonicalize_name(requirement.name)] = Version(lower[0])
    pins: dict[str, Version] = {}
    for line in (REPO / "constraints/oldest.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            pins[canonicalize_name(name)] = Version(pinned)
    assert pins == floors


def test_the_readmes_install_commands_need_no_package_index() -> None:
    """No index has the package yet: the README's first commands install it from the
    checkout or a wheel built from it, and scripts/wheel-smoke runs them as they stand."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("\n## Install\n") :]
    block = section[section.index("```sh\n") + 6 :]
    block = block[: block.index("```")]
    assert readme.index("\n## Install\n") < readme.index("```sh\n", readme.index("## Quick start"))
    installs = [
        command.split("#")[0].split()
        for line in block.splitlines()
        for command in line.split("&&")
        if command.split()[:2] in (["pip", "install"], ["pip", "wheel"])
    ]
    assert installs
    for argv in installs:
        targets = [a for a in argv[2:] if not a.startswith("-") and a != "dist"]
        assert targets and all(t.startswith((".", "dist/")) for t in targets), argv
    assert "## Install$" in (REPO / "scripts/wheel-smoke").read_text()
