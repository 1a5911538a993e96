"""deploy/grafana/docker-variant.json asks only for metrics the servers serve, by the labels
they carry: every ``variant_*`` name in a panel's or variable's query is one that
variant-proxy's or variant-scheduler's ``/metrics`` lists (scraped here from a running
scheduler with agents and placements, and from the proxy's metrics), and every label a
query selects or groups by is one that metric has. The Helm chart carries the same file."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import render_kubernetes
from docker_variant.proxy.metrics import ProxyMetrics
from test_scheduler_api import client_for, put_agent
from test_scheduler_support import H200_R570, INDEX, agent_body, open_store

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy/grafana/docker-variant.json"
NAME = re.compile(r"\bvariant_(?:proxy|scheduler)_\w+")
# the labels after `by (`, and the label names of a `{name="..."}` selector
GROUPED = re.compile(r"\bby \(([^)]*)\)")
SELECTOR = re.compile(r"\b(variant_\w+)\{([^}]*)\}")
PROMETHEUS_LABELS = {"le", "job", "instance", "__name__"}  # the scraper's and histograms'


def _served(text: str) -> dict[str, set[str]]:
    """Every sample name the text holds or its families' types imply, with its labels."""
    served: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
        for suffix in suffixes.get(family.type, [""]):
            served.setdefault(family.name + suffix, set())
        for sample in family.samples:
            served.setdefault(sample.name, set()).update(sample.labels)
    return served


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, set[str]]]:
    proxy = ProxyMetrics()
    proxy.request_counts[("variants", "GET", "200")] = 1
    proxy.upstream_errors.labels("down").inc()
    metrics = _served(proxy.render().decode())
    root = tmp_path_factory.mktemp("dashboard")
    with open_store("sqlite", root) as store, client_for(store) as api:
        put_agent(api, "h200-a", agent_body(H200_R570, 4))
        body = {"index": INDEX, "nodes": 1, "devices_per_node": 2}
        assert api.post("/v1/placements", json=body).status_code == 201
        metrics |= _served(api.get("/metrics").text)
    yield metrics


def _queries(document: Any) -> Iterator[str]:
    if isinstance(document, dict):
        for key, value in document.items():
            if (key in ("expr", "definition") and isinstance(value, str)) or (
                key == "query" and isinstance(value, str)
            ):
                yield value
            else:
                yield from _queries(value)
    elif isinstance(document, list):
        for item in document:
            yield from _queries(item)


def test_every_metric_the_dashboard_asks_for_is_served(served: dict[str, set[str]]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = list(_queries(dashboard))
    assert len(queries) >= 15
    asked = {name for query in queries for name in NAME.findall(query)}
    assert {n.split("_")[1] for n in asked} == {"proxy", "scheduler"}
    assert not asked - served.keys(), sorted(asked - served.keys())


def test_every_label_the_dashboard_uses_is_on_its_metric(served: dict[str, set[str]]) -> None:
    for query in _queries(json.loads(DASHBOARD.read_text())):
        names = set(NAME.findall(query))
        labels_of = set().union(*(served.get(n, set()) for n in names)) | PROMETHEUS_LABELS
        for group in GROUPED.findall(query):
            wanted = {label.strip() for label in group.split(",")}
            assert wanted <= labels_of, (query, wanted - labels_of)
        for name, selector in SELECTOR.findall(query):
            wanted = {part.split("=")[0].strip().rstrip("!~") for part in selector.split(",")}
            assert wanted <= served[name] | PROMETHEUS_LABELS, (query, wanted)


def test_the_panels_are_well_formed() -> None:
    """Each panel has a unique id, a place on the grid and queries with distinct refIds on
    the dashboard's data source variable."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys()
        if panel["type"] == "row":
            continue
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs) and refs, panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "job"}


def test_the_chart_carries_the_same_dashboard() -> None:
    rendered = render_kubernetes.helm_template("grafana.dashboard.enabled=true")
    (config_map,) = [
        d for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"] == "docker-variant-dashboard"
    ]  # fmt: skip
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["docker-variant.json"]) == json.loads(
        DASHBOARD.read_text()
    )
