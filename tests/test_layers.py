"""The package map holds: every module imports only modules of its own layer or below.

The layers are the ones ``docker_variant/__init__.py`` draws; a module is placed by its
longest matching prefix. Imports inside functions and under ``TYPE_CHECKING`` count too:
an upward arrow is one whether or not it runs at import time.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import docker_variant

PACKAGE = Path(docker_variant.__file__).parent

# Bottom first. Within a layer, modules may import each other.
LAYERS: list[tuple[str, ...]] = [
    # pure rules every layer may use: errors, bounded readers, the wire grammar
    (
        "errors",
        "numtext",
        "jsondoc",
        "tomldoc",
        "textdoc",
        "safetext",
        "retry",
        "localcache",
        "lazy",
        "pluginmeta",
        "openapi",
        "oci.grammar",
        "oci.mediatypes",
        "oci.errcode",
        "oci.extension",
        "oci.bodies",
    ),
    ("vendors",),
    ("variant",),
    ("api",),  # the wire shapes the node agent and the scheduler share
    ("providers",),
    ("oci",),
    ("docker",),
    ("contents",),
    ("planner",),  # the pure planner the scheduler and ``k8s gang`` share
    ("publish", "k8s"),
    ("server",),
    ("proxy", "scheduler"),
    ("agent",),
    # commands: they wire everything below into a process
    # (``agent.command`` is ``variant-scheduler agent``'s: it checks the [kubernetes] extra)
    (
        "render",
        "cli",
        "entry",
        "extras",
        "__main__",
        "scheduler.__main__",
        "proxy.__main__",
        "agent.command",
    ),
]


def layer_of(module: str) -> int:
    best, best_len = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    assert best >= 0, f"docker_variant.{module} is in no layer of the package map"
    return best


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imported(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("docker_variant."):
                base = node.module.removeprefix("docker_variant.")
                found.add(base)
            elif node.module == "docker_variant":
                # the package root's own names (__version__) are not a layer
                found.update(a.name for a in node.names if not a.name.startswith("__"))
        elif isinstance(node, ast.Import):
            found.update(
                alias.name.removeprefix("docker_variant.")
                for alias in node.names
                if alias.name.startswith("docker_variant.")
            )
    return found


def test_every_import_points_down_the_package_map() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if not module:
            continue  # the package's own __init__: it imports nothing
        own = layer_of(module)
        for target in imported(ast.parse(path.read_text(encoding="utf-8"))):
            if layer_of(target) > own:
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_the_scheduler_server_never_detects() -> None:
    """Detection is the node agent's job: the server's modules never import providers/ or
    the agent (only ``variant-scheduler``'s command wiring starts the agent)."""
    offenders = []
    for path in sorted((PACKAGE / "scheduler").rglob("*.py")):
        if path.name == "__main__.py":
            continue
        for target in imported(ast.parse(path.read_text(encoding="utf-8"))):
            if target.split(".")[0] in {"providers", "agent"}:
                offenders.append(f"{module_name(path)} -> {target}")
    assert offenders == []


def test_the_node_agent_never_imports_the_scheduler() -> None:
    """The agent runs on every node: it speaks the wire shapes of ``api/`` and never loads
    the scheduler's server (SQLAlchemy, Starlette, Jinja2, prometheus_client)."""
    offenders = []
    for path in sorted((PACKAGE / "agent").rglob("*.py")):
        for target in imported(ast.parse(path.read_text(encoding="utf-8"))):
            if target.split(".")[0] in {"scheduler", "proxy"}:
                offenders.append(f"{module_name(path)} -> {target}")
    assert offenders == []


#: The modules that need an extra (``docker_variant.extras``): the servers' own.
SERVER_MODULES = ("proxy", "scheduler", "server")
SERVER_ONLY = {"uvicorn", "starlette", "sqlalchemy", "jinja2", "prometheus_client", "redis"}
_BLOCK_SERVER_EXTRAS = """
import importlib, importlib.abc, pkgutil, sys
import docker_variant
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is in a server extra")
sys.meta_path.insert(0, Blocked())
for info in pkgutil.walk_packages(docker_variant.__path__, "docker_variant."):
    short = info.name.removeprefix("docker_variant.")
    if short.split(".")[0] in {servers!r} or short.endswith("__main__"):
        continue
    importlib.import_module(info.name)
from docker_variant.cli import app
sys.argv = ["docker-variant", "resolve", "--index", {index!r}, "--providers-file", {host!r}]
app()
"""


def test_the_cli_needs_no_server_extra() -> None:
    """The bare install is the CLI: with the servers' libraries made unimportable, every
    module outside the servers imports and a command runs (``scripts/wheel-smoke`` does the
    same with a real bare install)."""
    root = PACKAGE.parents[1]
    script = _BLOCK_SERVER_EXTRAS.format(
        blocked=sorted(SERVER_ONLY),
        servers=SERVER_MODULES,
        index=str(root / "examples" / "pytorch-2.12.0.json"),
        host=str(root / "examples" / "hosts" / "h200-r570.json"),
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "2.12.0-cu128"), done.stderr[-3000:]


def test_the_map_in_the_package_docstring_names_every_package() -> None:
    doc = docker_variant.__doc__ or ""
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    missing = [name for name in packages if f"``{name}``" not in doc]
    assert missing == []


def _module_graph() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports (anywhere in it)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py") if module_name(path)}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        named = {  # ``from docker_variant.cli import plugin``: the module cli.plugin
            f"{node.module.removeprefix('docker_variant.')}.{alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("docker_variant.")
            for alias in node.names
        }
        for target in imported(tree) | (named & modules.keys()):
            # ``from docker_variant.oci import client`` names a module or a package's name
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def test_no_import_cycle_between_modules() -> None:
    """No module reaches itself through imports, those inside functions included (a module
    naming its own package, to import a sibling, is not an arrow back to the package)."""
    graph = _module_graph()
    cycles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if module.startswith(target + "."):
                continue  # a module naming its own package (``from docker_variant.cli import k8s``)
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []
