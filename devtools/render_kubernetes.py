"""Render deploy/kubernetes/, the kustomize base, from the Helm chart's defaults.

The chart (deploy/helm/docker-variant) is the one source of the Kubernetes objects; the base
is what ``helm template`` makes of it with its defaults and the example site values below
(the chart requires them: an overlay replaces them), and the Namespace, which Helm users
create with ``--create-namespace``, one file per template. ``--check`` changes nothing and
exits 1 naming each file that differs, which the tests run.

    python devtools/render_kubernetes.py [--check]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "docker-variant"
BASE = REPO / "deploy" / "kubernetes"
NAMESPACE = "docker-variant"
HEADER = (
    "# Rendered from the Helm chart deploy/helm/docker-variant with its defaults by\n"
    "# devtools/render_kubernetes.py: edit the chart, then run that again.\n"
)
#: what the chart requires of a site, as examples an overlay replaces: the registry (which
#: also holds the images) and the proxy's address as the nodes resolve it
SITE = (
    "image.registry=registry.example.internal:5000",
    "proxy.upstream=http://registry.example.internal:5000",
    "scheduler.registries={registry.example.internal:5000}",
    "agent.containerdHosts.server=https://variant-proxy.example.internal:5080",
)
KUSTOMIZATION = "kustomization.yaml"
# Helm orders documents by kind for installing; a file reads better as its template wrote it,
# the ConfigMap and the workload (with the file's comment) first.
KIND_ORDER = ("Namespace", "ConfigMap", "Deployment", "DaemonSet", "Service",
              "PodDisruptionBudget", "NetworkPolicy")  # fmt: skip
KIND = re.compile(r"^kind: (\w+)$", re.MULTILINE)
SOURCE = re.compile(r"^---\n# Source: docker-variant/templates/([\w.-]+\.yaml)\n", re.MULTILINE)


def tool(name: str) -> str:
    """A Kubernetes tool: $HELM / $KUBECTL, else scripts/k8s-tools' copy, else PATH's."""
    installed = REPO / ".cache" / "k8s-tools" / name
    return os.environ.get(name.upper()) or (str(installed) if installed.exists() else name)


def helm_template(*values: str) -> str:
    """``helm template`` of the chart in the namespace, with the example site values and
    ``--set`` VALUES (which may replace them)."""
    argv = [tool("helm"), "template", "docker-variant", str(CHART), "--namespace", NAMESPACE]
    for value in (*SITE, *values):
        argv += ["--set", value]
    result = subprocess.run(argv, capture_output=True, text=True, check=True)
    return result.stdout


def _kind_rank(document: str) -> int:
    found = KIND.search(document)
    kind = found.group(1) if found else ""
    return KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)


def render() -> dict[str, str]:
    """The base's files: each template's documents, in Helm's order, then the kustomization."""
    rendered = helm_template("namespace.create=true")
    pieces = SOURCE.split(rendered)
    files: dict[str, list[str]] = {}
    for template, text in zip(pieces[1::2], pieces[2::2], strict=True):
        # nindent leaves the indentation on a block's empty lines: no trailing blanks here
        text = "\n".join(line.rstrip() for line in text.strip("\n").splitlines())
        files.setdefault(template, []).append(text + "\n")
    out = {
        name: HEADER + "---\n".join(sorted(documents, key=_kind_rank))
        for name, documents in files.items()
    }
    resources = "".join(f"  - {name}\n" for name in sorted(out))
    out[KUSTOMIZATION] = (
        HEADER + "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n{resources}"
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 on a difference"
    )
    check = parser.parse_args().check
    wanted = render()
    present = {p.name for p in BASE.glob("*.yaml")}
    stale = sorted(
        name
        for name in wanted.keys() | present
        if not (BASE / name).exists() or (BASE / name).read_text() != wanted.get(name)
    )
    if check:
        for name in stale:
            print(
                f"render_kubernetes: deploy/kubernetes/{name} is not the chart's", file=sys.stderr
            )
        return 1 if stale else 0
    for name in stale:
        if name in wanted:
            (BASE / name).write_text(wanted[name])
        else:
            (BASE / name).unlink()
        print(f"deploy/kubernetes/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
