"""What-if (docs/reference/scheduler-api.md ``POST /v1/what-if``, issue 10): every prediction is checked by sending the
heartbeats of the predicted nodes, built from the template, and placing for real with
``POST /v1/placements``; one node fewer must not place. What-if itself changes nothing."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

import devstack
from conftest import RunningRegistry
from docker_variant.agent.health import NVML_KIND
from docker_variant.planner.placement import Plan, plan
from docker_variant.planner.pool import Pool, build_pool
from docker_variant.scheduler import Store
from docker_variant.scheduler.__main__ import main
from docker_variant.scheduler.documents import SHARE, AgentReport
from docker_variant.scheduler.tokens import load_tokens
from docker_variant.scheduler.whatif import (
    MAX_VIRTUAL_DEVICES,
    WhatIfTooCostlyError,
    parse_what_if,
    what_if,
)
from docker_variant.variant import VariantIndex
from imaging import ImageBuilder
from test_fuzz import MUTATIONS, _mutate
from test_scheduler_api import client_for, error_message, put_agent, sqlite_store, store
from test_scheduler_security import TOKENS, TOKENS_TOML, bearer
from test_scheduler_support import (
    A100_R535,
    B200_R580,
    H200_R570,
    H200_R580,
    L4_R535,
    X86_V3,
    X86_V4,
    agent_body,
    agent_report,
    free_port,
    gpu_lists,
    gpu_only_index,
    open_store,
)

__all__ = ["sqlite_store", "store"]  # the fixtures, used by name

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "what-if"
A100_R570 = ((12, 8), (8, 0))  # an A100 on a newer driver: CUDA 12.8, compute capability 8.0
GRACE = {"aarch64": {"version": ["9.0a", "8a"]}}


def template(name: str, gpu: Any, count: int = 4, **extra: Any) -> dict[str, Any]:
    """A node template whose nodes have ``count`` GPUs of ``gpu`` (see agent_body)."""
    host = extra.pop("host", X86_V4)
    body = agent_body(gpu, count, host=host)
    return {"name": name, "host": body["host"], "devices": body["devices"], **extra}


def heartbeat(of: dict[str, Any]) -> dict[str, Any]:
    """What a node built from the template reports."""
    keys = ("host", "devices", "platform")
    return {key: of[key] for key in keys if key in of}


def ask(api: httpx.Client, request: dict[str, Any], templates: list[Any]) -> dict[str, Any]:
    response = api.post("/v1/what-if", json={"request": request, "templates": templates})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def state(api: httpx.Client) -> dict[str, Any]:
    """Everything the API shows: agents (each in detail) and placements."""
    agents = api.get("/v1/agents").json()["agents"]
    return {
        "agents": agents,
        "detail": [api.get(f"/v1/agents/{a['agent_id']}").json() for a in agents],
        "placements": api.get("/v1/placements").json()["placements"],
    }


@contextlib.contextmanager
def added(api: httpx.Client, of: dict[str, Any], count: int) -> Iterator[list[str]]:
    """``count`` real agents built from template ``of``, deregistered afterwards (and
    uncordoned, as a drain leaves them, so that the next check may add them again)."""
    ids = [f"{of['name']}-new-{i}" for i in range(count)]
    for agent_id in ids:
        put_agent(api, agent_id, heartbeat(of))
    try:
        yield ids
    finally:
        for agent_id in ids:
            assert api.delete(f"/v1/agents/{agent_id}").status_code == 200
            assert api.post(f"/v1/agents/{agent_id}/uncordon").status_code == 200


def check_prediction(
    api: httpx.Client, request: dict[str, Any], of: dict[str, Any], nodes: int, variant: str | None
) -> None:
    """``nodes`` new nodes of ``of`` make the request place with ``variant``, using them;
    ``nodes - 1`` do not. Leaves the pool as it found it."""
    before = state(api)
    with added(api, of, nodes - 1):
        assert api.post("/v1/placements", json=request).status_code == 409
    with added(api, of, nodes) as ids:
        placed = api.post("/v1/placements", json=request)
        assert placed.status_code == 201, placed.text
        assert placed.json()["variant"] == variant
        used = {a["agent_id"] for a in placed.json()["allocations"]}
        assert used & set(ids)
        assert api.delete(f"/v1/placements/{placed.json()['id']}").status_code == 204
    assert state(api)["placements"] == before["placements"]


def check_no_help(api: httpx.Client, request: dict[str, Any], of: dict[str, Any], n: int) -> None:
    with added(api, of, n):
        assert api.post("/v1/placements", json=request).status_code == 409


# --------------------------------------------------------------------------- scenarios


def test_h200_and_a100_templates_predict_what_placing_does(store: Store) -> None:
    """Two H200 nodes free and a third half used; a 4-node gang of 4 GPUs each. H200 nodes
    join the H200s (cu128); A100s on R535 (CUDA 12.2) share no build with an H200, so the
    gang needs 4 of them (cu122); A100s on R570 share cu126 with the H200s: 2 suffice."""
    request = {"index": gpu_only_index(), "nodes": 4, "devices_per_node": 4}
    templates = [
        template("h200", H200_R570, cost=10),
        template("a100", A100_R535, cost=4),
        template("a100-r570", A100_R570, cost=6),
        template("l4", L4_R535, count=2, cost=1),  # 2 GPUs a node: never 4
    ]
    with client_for(store) as api:
        for i in range(3):
            put_agent(api, f"h200-{i}", agent_body(H200_R570, 4))
        held = api.post("/v1/placements", json=request | {"nodes": 1, "devices_per_node": 2})
        assert held.status_code == 201
        before = state(api)
        answer = ask(api, request, templates)
        assert state(api) == before
        assert answer == {
            "fits_now": False,
            "variant": None,
            "options": [
                {"template": "h200", "nodes": 2, "variant": "cu128"},
                {"template": "a100", "nodes": 4, "variant": "cu122"},
                {"template": "a100-r570", "nodes": 2, "variant": "cu126"},
            ],
            "cheapest": "a100-r570",  # 2 * 6 < 4 * 4 < 2 * 10
            "reasons": {"l4": "its nodes have 2 devices; the request needs 4 on each node"},
        }
        by_name = {t["name"]: t for t in templates}
        for option in answer["options"]:
            of = by_name[option["template"]]
            check_prediction(api, request, of, option["nodes"], option["variant"])
        check_no_help(api, request, by_name["l4"], 4)
        assert state(api)["placements"] == before["placements"]


def _amd64_image(label: str) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(label.encode()).hexdigest()
    return {"tag": f"2.0-{label}", "digest": digest, "platforms": {"linux/amd64": digest}}


#: The CUDA builds, for linux/amd64 only.
AMD64_ONLY = {
    **gpu_only_index(),
    "images": {label: _amd64_image(label) for label in ("cu130", "cu128", "cu126", "cu122")},
}


def test_an_arm64_template_cannot_help_an_amd64_only_index(sqlite_store: Store) -> None:
    request = {"index": AMD64_ONLY, "nodes": 2, "devices_per_node": 4}
    gh200 = template("gh200", H200_R570, host=GRACE, platform="linux/arm64", cost=1)
    implied = template("grace", H200_R570, host=GRACE)  # arm64 from its aarch64 lists
    h200 = template("h200", H200_R580, cost=9)
    with client_for(sqlite_store) as api:
        put_agent(api, "h200-0", agent_body(H200_R570, 4))
        answer = ask(api, request, [gh200, implied, h200])
        assert answer["options"] == [{"template": "h200", "nodes": 1, "variant": "cu128"}]
        assert answer["cheapest"] == "h200"  # the arm64 one is cheaper, and cannot help
        for name in ("gh200", "grace"):
            assert answer["reasons"][name] == (
                "no variant fits a node of it (cu122, cu126, cu128, cu130: "
                "no linux/arm64 image (it has linux/amd64))"
            )
        check_prediction(api, request, h200, 1, "cu128")
        check_no_help(api, request, gh200, request["nodes"])
        check_no_help(api, request, implied, request["nodes"])


def test_a_gang_too_large_for_any_template(sqlite_store: Store) -> None:
    """8 nodes of 4 GPUs, one H200 node in the pool: 7 more H200s, or 8 A100s (R535 shares
    no build with H200), each over its max_nodes."""
    request = {"index": gpu_only_index(), "nodes": 8, "devices_per_node": 4}
    h200 = template("h200", H200_R570, max_nodes=6, cost=10)
    a100 = template("a100", A100_R535, max_nodes=7, cost=4)
    with client_for(sqlite_store) as api:
        put_agent(api, "h200-0", agent_body(H200_R570, 4))
        answer = ask(api, request, [h200, a100])
        assert answer == {
            "fits_now": False,
            "variant": None,
            "options": [],
            "cheapest": None,
            "reasons": {
                "h200": "needs 7 new nodes, more than its max_nodes 6",
                "a100": "needs 8 new nodes, more than its max_nodes 7",
            },
        }
        # max_nodes of them do not place it; the count the reason names does
        check_prediction(api, request, h200, 7, "cu128")
        check_prediction(api, request, a100, 8, "cu122")
        # with room for them, they are options
        roomy = [h200 | {"max_nodes": 7}, a100 | {"max_nodes": 100}]
        assert ask(api, request, roomy)["options"] == [
            {"template": "h200", "nodes": 7, "variant": "cu128"},
            {"template": "a100", "nodes": 8, "variant": "cu122"},
        ]


def test_fits_now_agrees_with_placing_and_changes_nothing(store: Store) -> None:
    request = {"index": gpu_only_index(), "nodes": 2, "devices_per_node": 2}
    templates = [template("h200", H200_R570, cost=1)]
    with client_for(store) as api:
        put_agent(api, "a100-0", agent_body(A100_R570, 4))
        put_agent(api, "h200-0", agent_body(H200_R570, 4))
        first = api.post("/v1/placements", json=request | {"nodes": 1})
        assert first.status_code == 201
        before = state(api)
        answers = [ask(api, request, templates) for _ in range(3)]
        # asking in an empty group, or for a gang that does not fit, changes nothing either
        ask(api, request | {"resource_group": "other"}, templates)
        ask(api, request | {"nodes": 3}, templates)
        assert state(api) == before
        assert answers[0] == answers[1] == answers[2]
        answer = answers[0]
        assert answer["fits_now"] is True
        assert answer["options"] == [] and answer["cheapest"] is None
        assert answer["reasons"] == {"h200": "not needed: the request fits today's pool"}
        placed = api.post("/v1/placements", json=request)
        assert placed.status_code == 201
        assert placed.json()["variant"] == answer["variant"] == "cu126"
        # now nothing fits: the H200 and A100 both hold a placement's devices
        after = ask(api, request, templates)
        assert after["fits_now"] is False and after["variant"] is None
        assert after["options"] == [{"template": "h200", "nodes": 1, "variant": "cu126"}]


def test_shares_and_unhealthy_devices_count_as_placing_counts_them(sqlite_store: Store) -> None:
    """h200-0 has half of each GPU in use, h200-1 two of four GPUs unhealthy: a fractional
    gang may use h200-0, a whole-device gang neither."""
    fraction = {"index": gpu_only_index(), "nodes": 3, "devices_per_node": 4}
    fraction["shares_per_device"] = 0.5
    whole = {"index": gpu_only_index(), "nodes": 3, "devices_per_node": 4}
    h200 = template("h200", H200_R570)
    with client_for(sqlite_store) as api:
        put_agent(api, "h200-0", agent_body(H200_R570, 4))
        sick = agent_body(H200_R570, 4) | {"unhealthy": {"cuda": ["GPU-0", "GPU-1"]}}
        put_agent(api, "h200-1", sick)
        half = api.post("/v1/placements", json=fraction | {"nodes": 1})
        assert half.status_code == 201
        assert [a["agent_id"] for a in half.json()["allocations"]] == ["h200-0"]
        on_fractions = ask(api, fraction, [h200])["options"]
        assert on_fractions == [{"template": "h200", "nodes": 2, "variant": "cu128"}]
        assert ask(api, whole, [h200])["options"] == [
            {"template": "h200", "nodes": 3, "variant": "cu128"}
        ]
        check_prediction(api, fraction, h200, 2, "cu128")
        check_prediction(api, whole, h200, 3, "cu128")


def test_nodes_that_join_after_asking_an_empty_scheduler_place(sqlite_store: Store) -> None:
    """The autoscaler's path from nothing: ask, provision, heartbeat, place. (The pool read
    while empty once kept an empty profile table of its own: the placement failed, 500.)"""
    request = {"index": gpu_only_index(), "nodes": 2, "devices_per_node": 4}
    h200 = template("h200", H200_R570)
    with client_for(sqlite_store) as api:
        answer = ask(api, request, [h200])
        assert answer["options"] == [{"template": "h200", "nodes": 2, "variant": "cu128"}]
        check_prediction(api, request, h200, 2, "cu128")


def test_the_resource_group_is_the_pool_asked(sqlite_store: Store) -> None:
    request = {"index": gpu_only_index(), "nodes": 2, "devices_per_node": 4}
    h200 = template("h200", H200_R570)
    with client_for(sqlite_store) as api:
        put_agent(api, "h200-0", agent_body(H200_R570, 4, group="gpu"))
        put_agent(api, "h200-1", agent_body(H200_R570, 4, group="other"))
        one_new = [{"template": "h200", "nodes": 1, "variant": "cu128"}]
        in_gpu = ask(api, request | {"resource_group": "gpu"}, [h200])
        assert in_gpu["options"] == one_new
        # a gang stays in one group: one new node in either group would do, not none
        anywhere = ask(api, request, [h200])
        assert (anywhere["fits_now"], anywhere["options"]) == (False, one_new)
        assert ask(api, request | {"spread": True}, [h200])["fits_now"] is True


# --------------------------------------------------------------------------- the search


GPUS = [H200_R570, H200_R580, A100_R535, A100_R570, B200_R580, L4_R535]


def _random_heartbeat(rng: random.Random, fewest: int = 0) -> dict[str, Any]:
    """A node of ``fewest``..5 GPUs, each of a random kind, on an x86-64 host (or, one in
    four, an aarch64 one)."""
    count = rng.randint(fewest, 5)
    devices = {f"GPU-{i}": gpu_lists(rng.choice(GPUS)) for i in range(count)}
    host = rng.choice([X86_V4, X86_V3, X86_V4, GRACE])
    return {"resource_group": "default", "host": host, "devices": {"cuda": devices}}


def _pool(reports: list[AgentReport], usage: dict[tuple[str, str, str], int | None]) -> Pool:
    """The pool of ``reports`` with devices in use: whole (None) or some shares."""
    pool = build_pool(reports, {key for key, used in usage.items() if used is None})
    for key, used in usage.items():
        if used is not None:
            pool.allocate([key], shares=used)
    return pool


def test_fewest_nodes_equals_trying_every_count() -> None:
    """The search against a linear scan over N = 0..nodes + 2, each a plan on a pool built
    afresh from reports (today's agents, some devices unhealthy, some in use whole or in
    part, plus N built from the template), for whole and fractional requests: the smallest
    N that places, its variant, and that more nodes never stop it placing."""
    rng = random.Random(20261203)
    index = VariantIndex.from_json(AMD64_ONLY, "amd64-only index")
    for case in range(100):
        bodies = {f"n{i}": _random_heartbeat(rng) for i in range(rng.randint(0, 6))}
        reports = []
        usage: dict[tuple[str, str, str], int | None] = {}
        for agent_id, body in bodies.items():
            ids = list(body["devices"]["cuda"])
            sick = frozenset(("cuda", d) for d in ids if rng.random() < 0.15)
            reports.append(replace(agent_report(agent_id, body), unhealthy=sick))
            for device_id in ids:
                if ("cuda", device_id) not in sick and rng.random() < 0.4:
                    used = rng.choice([None, SHARE // 4, SHARE // 2])
                    usage[(agent_id, "cuda", device_id)] = used
        pool = _pool(reports, usage)
        request = {"index": AMD64_ONLY, "nodes": rng.randint(1, 5)}
        request["devices_per_node"] = rng.randint(0, 3)
        if request["devices_per_node"] and rng.random() < 0.4:
            request["shares_per_device"] = rng.choice([0.25, 0.5, 0.75])
        of = {"name": "t", **heartbeat(_random_heartbeat(rng, fewest=1))}
        question = parse_what_if({"request": request, "templates": [of]})
        answer = what_if(index, question.request, pool, question.templates).to_json()
        outcomes: list[str | bool | None] = []  # per N: the variant placed, or False
        for n in range(request["nodes"] + 3):
            new = {"resource_group": "default", **heartbeat(of)}
            extra = [agent_report(f"t-{i}", new) for i in range(n)]
            found = plan(
                index,
                _pool([*reports, *extra], usage),
                request["nodes"],
                request["devices_per_node"],
                shares=question.request.shares,
            )
            outcomes.append(found.candidate.label if isinstance(found, Plan) else False)
        placed = [n for n, outcome in enumerate(outcomes) if outcome is not False]
        if placed:  # monotone: from the first N that places, every larger N places
            assert placed == list(range(placed[0], len(outcomes))), (case, outcomes)
        if outcomes[0] is not False:
            assert answer["fits_now"] and answer["variant"] == outcomes[0], case
        elif placed:
            expected = [{"template": "t", "nodes": placed[0], "variant": outcomes[placed[0]]}]
            assert answer["options"] == expected, (case, answer)
            assert outcomes[-1] == outcomes[request["nodes"]], case  # past nodes: the same
        else:
            assert answer["options"] == [] and "t" in answer["reasons"], (case, answer)


def test_what_if_leaves_the_pool_alone() -> None:
    reports = [agent_report(f"h{i}", agent_body(H200_R570, 4)) for i in range(2)]
    pool = build_pool(reports, {("h0", "cuda", "GPU-0")})
    profiles = dict(pool.profiles)
    buckets = [(key, list(agents)) for key, agents in pool.buckets()]
    held = sorted(pool.allocations())
    question = parse_what_if(
        {
            "request": {"index": gpu_only_index(), "nodes": 5, "devices_per_node": 4},
            "templates": [template("a100", A100_R535), template("h200", H200_R570)],
        }
    )
    assert question.request.index is not None
    answer = what_if(question.request.index, question.request, pool, question.templates)
    assert [o.nodes for o in answer.options] == [5, 4]
    assert dict(pool.profiles) == profiles and sorted(pool.allocations()) == held
    assert [(key, list(agents)) for key, agents in pool.buckets()] == buckets


# --------------------------------------------------------------------------- input


def _body(**changes: Any) -> dict[str, Any]:
    request = {"index": gpu_only_index(), "nodes": 1, "devices_per_node": 1}
    return {"request": request, "templates": [template("h200", H200_R570)]} | changes


BAD_DEVICE = {"cuda": {"GPU-0": {"nvidia": {"sm_arch": ["9.0 "]}}}}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "a what-if request must be a JSON object, got list"),
        ({"templates": []}, 'what-if request: "request" (a placement request) is required'),
        (_body(extra=1), "what-if request: unknown key 'extra' (expected request, templates)"),
        (
            _body(request={"index": gpu_only_index(), "nodes": 0, "devices_per_node": 1}),
            "request: nodes must be an integer 1..10000, got 0",
        ),
        (
            _body(templates={"name": "x"}),
            "templates must be a JSON list of node templates, got dict",
        ),
        (_body(templates=[{"host": {}}]), "templates[0]: name None is not valid"),
        (_body(templates=[{"name": "a b"}]), "templates[0]: name 'a b' is not valid"),
        (_body(templates=[{"name": "a", "nodes": 2}]), "templates[0]: unknown key 'nodes'"),
        (_body(templates=[{"name": "a"}, {"name": "a"}]), "templates: name 'a' appears twice"),
        (
            _body(templates=[{"name": "a", "host": {"Bad": {}}}]),
            "template 'a': host: namespace 'Bad' does not match",
        ),
        (
            _body(templates=[{"name": "a", "devices": BAD_DEVICE}]),
            "template 'a': device cuda/GPU-0: nvidia :: sm_arch: value '9.0 ' does not match",
        ),
        (
            _body(templates=[{"name": "a", "devices": {"cuda": {"GPU 0": {}}}}]),
            "template 'a': devices.cuda: device id 'GPU 0' is not valid",
        ),
        (
            _body(templates=[{"name": "a", "platform": "linux"}]),
            "template 'a': platform: 'linux' is not a platform",
        ),
        (
            _body(templates=[{"name": "a", "max_nodes": 0}]),
            "template 'a': max_nodes must be an integer 1..10000, got 0",
        ),
        (
            _body(templates=[{"name": "a", "max_nodes": True}]),
            "template 'a': max_nodes must be an integer 1..10000, got True",
        ),
        (_body(templates=[{"name": "a", "cost": -1}]), "template 'a': cost must be a number >= 0"),
        (_body(templates=[{"name": "a", "cost": "9"}]), "template 'a': cost must be a number >= 0"),
        (
            _body(templates=[{"name": f"t{i}"} for i in range(65)]),
            "templates: 65 given, at most 64",
        ),
    ],
)
def test_bad_what_if_requests_are_400_naming_the_value(
    sqlite_store: Store, body: Any, message: str
) -> None:
    with client_for(sqlite_store) as api:
        response = api.post("/v1/what-if", json=body)
    assert response.status_code == 400, response.text
    assert message in error_message(response)


def test_a_what_if_above_the_size_limit_is_400_naming_it(sqlite_store: Store) -> None:
    """10,000 nodes of a 1,024-GPU template (81 s of CPU before the limit) is refused before
    any plan; the largest question allowed still answers."""
    heavy = template("big", H200_R570, 1024)
    request = {"index": gpu_only_index(), "nodes": 10_000, "devices_per_node": 1024}
    with client_for(sqlite_store) as api:
        refused = api.post("/v1/what-if", json={"request": request, "templates": [heavy]})
        assert refused.status_code == 400, refused.text
        message = error_message(refused)
        assert "10000 nodes x 1024 devices" in message and f"{MAX_VIRTUAL_DEVICES:,}" in message
        assert "\n" not in message
        largest = {**request, "nodes": MAX_VIRTUAL_DEVICES // 1024}
        answer = api.post("/v1/what-if", json={"request": largest, "templates": [heavy]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["options"] == [{"template": "big", "nodes": 256, "variant": "cu128"}]


def test_what_if_stops_at_its_deadline_counted_in_plans() -> None:
    """A clock that moves one second at each reading (0 at the start, then once before each
    plan): a 5 s deadline lets exactly four plans run (the question needs many more: 64
    templates), then stops with one line naming the deadline."""
    question = parse_what_if(
        {
            "request": {"index": gpu_only_index(), "nodes": 8, "devices_per_node": 4},
            "templates": [template(f"t{i}", H200_R570) for i in range(64)],
        }
    )
    assert question.request.index is not None
    ticks = iter(range(1000))
    with pytest.raises(WhatIfTooCostlyError, match="deadline of 5 s of planning, after 4 plans"):
        what_if(
            question.request.index,
            question.request,
            build_pool([]),
            question.templates,
            deadline_s=5,
            clock=lambda: float(next(ticks)),
        )
    ample = what_if(question.request.index, question.request, build_pool([]), question.templates)
    assert len(ample.options) == 64


def _cpu_seconds(pid: int) -> float:
    """User and system CPU the process has used (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_server_busy_with_a_what_if_stops_on_sigterm(tmp_path: Path) -> None:
    """64 templates of 10,000 nodes x 26 GPUs (about a minute of planning without a bound):
    once the server is seen planning (its CPU time grows), SIGTERM stops it, cleanly, as soon
    as the question reaches its deadline, which it answers in one line."""
    scheduler = devstack.start_scheduler(tmp_path)
    try:
        request = {"index": gpu_only_index(), "nodes": 10_000, "devices_per_node": 26}
        body = {
            "request": request,
            "templates": [template(f"t{i}", H200_R570, 26) for i in range(64)],
        }
        answers: list[httpx.Response | Exception] = []

        def ask() -> None:
            try:
                answers.append(httpx.post(f"{scheduler.url}/v1/what-if", json=body, timeout=300))
            except httpx.HTTPError as exc:
                answers.append(exc)

        before = _cpu_seconds(scheduler.process.pid)
        asking = threading.Thread(target=ask)
        asking.start()
        while _cpu_seconds(scheduler.process.pid) < before + 3 and not answers:
            time.sleep(0.05)  # polling the process's CPU counter: nothing to await
        scheduler.process.send_signal(signal.SIGTERM)
        # uvicorn finishes the request in flight, then re-raises the signal it caught
        assert scheduler.process.wait(timeout=120) in (0, -signal.SIGTERM)
        asking.join(timeout=120)
    finally:
        scheduler.stop()
    assert len(answers) == 1
    answer = answers[0]
    assert isinstance(answer, httpx.Response), answer
    assert answer.status_code == 400, answer.text
    assert "deadline of 10 s of planning" in error_message(answer)


def test_what_if_takes_the_placement_token_rules(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    with (
        open_store("sqlite", tmp_path) as opened,
        client_for(opened, tokens=load_tokens(tokens)) as api,
    ):
        assert api.post("/v1/what-if", json=_body()).status_code == 401
        wrong = api.post("/v1/what-if", json=_body(), headers=bearer("agent0"))
        assert wrong.status_code == 403 and "needs the client role" in error_message(wrong)
        for who in ("alice", "ops"):
            answer = api.post("/v1/what-if", json=_body(), headers=bearer(who))
            assert answer.status_code == 200 and answer.json()["options"][0]["nodes"] == 1
        big = api.post(
            "/v1/what-if",
            content=b" " * (17 * 1024 * 1024),
            headers=bearer("alice") | {"Content-Type": "application/json"},
        )
        assert big.status_code == 413


@pytest.mark.e2e
def test_what_if_for_an_image_in_a_real_registry(
    registry: RunningRegistry, image_builder: ImageBuilder, sqlite_store: Store
) -> None:
    repo = "whatif/app"
    for label, cuda, sm in (("cu128", "12.8", "90_real"), ("cu122", "12.2", "80_real")):
        image_builder.build_and_push(
            f"{registry.host}/{repo}:3.0-{label}",
            {
                "dev.pep817.variant-label": label,
                "dev.pep817.variant.nvidia.cuda_version_lower_bound": cuda,
                "dev.pep817.variant.nvidia.sm_arch": sm,
            },
        )
    request = {"image": f"{registry.host}/{repo}:3.0", "nodes": 2, "devices_per_node": 1}
    h200, a100 = template("h200", H200_R570, 1), template("a100", A100_R535, 1)
    with client_for(sqlite_store, registries=[registry.host]) as api:
        put_agent(api, "a100-0", agent_body(A100_R535, 1))
        answer = ask(api, request, [h200, a100])
        assert answer["options"] == [
            {"template": "h200", "nodes": 2, "variant": "cu128"},
            {"template": "a100", "nodes": 1, "variant": "cu122"},
        ]
        check_prediction(api, request, h200, 2, "cu128")
        check_prediction(api, request, a100, 1, "cu122")
        missing = api.post(
            "/v1/what-if",
            json={"request": request | {"image": f"{registry.host}/{repo}:9"}, "templates": []},
        )
        assert missing.status_code == 404, missing.text


# --------------------------------------------------------------------------- CLI


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_asks_a_running_scheduler_with_the_example_files(
    sqlite_store: Store,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    templates, request = EXAMPLES / "templates.json", EXAMPLES / "request.json"
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(TOKENS_TOML)
    token = tmp_path / "alice.token"
    token.write_text(TOKENS["alice"] + "\n")
    with client_for(sqlite_store, tokens=load_tokens(tokens)) as api:
        url = str(api.base_url).rstrip("/")
        argv = ["what-if", "--scheduler", url, "--templates", str(templates), str(request)]
        code, out, err = run_cli([*argv, "--token-file", str(token)], capsys)
        assert code == 0, err
        answer = json.loads(out)
        assert answer == {
            "fits_now": False,
            "variant": None,
            "options": [
                {"template": "hgx-h200-r570", "nodes": 4, "variant": "cu128"},
                {"template": "dgx-a100-r535", "nodes": 4, "variant": "cu122"},
            ],
            "cheapest": "dgx-a100-r535",
            "reasons": {
                "gh200-x4-r570": "no variant fits a node of it (cu122, cu126, cu128, cu130: "
                "no linux/arm64 image (it has linux/amd64))"
            },
        }
        # the same answer as the API's, and checked by placing for real
        body = json.loads(request.read_text())
        listed = json.loads(templates.read_text())["templates"]
        # the example speaks the agents' vocabulary: the device name NVIDIA GPUs report under
        assert {name for t in listed for name in t["devices"]} == {NVML_KIND}
        assert body["device_name"] == NVML_KIND
        assert ask_as(api, "alice", body, listed) == answer
        # REQUEST "-": read from stdin
        stdin = io.TextIOWrapper(io.BytesIO(request.read_bytes()))
        monkeypatch.setattr("sys.stdin", stdin)
        code, out, err = run_cli([*argv[:-1], "-", "--token-file", str(token)], capsys)
        assert code == 0 and json.loads(out) == answer, err
        h200 = next(t for t in listed if t["name"] == "hgx-h200-r570")
        for i in range(4):
            headers = {"Authorization": f"Bearer {TOKENS['ops']}"}
            api.put(f"/v1/agents/h200-{i}", json=heartbeat(h200), headers=headers)
        placed = api.post("/v1/placements", json=body, headers=bearer("alice"))
        assert placed.status_code == 201 and placed.json()["variant"] == "cu128"
        # no token: 401 is bad input (exit 2), in one line
        code, out, err = run_cli(argv, capsys)
        assert code == 2 and out == "" and err.count("\n") == 1 and "401" in err
        # a gang no template can take: exit 1, the answer still printed
        too_big = tmp_path / "big.json"
        too_big.write_text(json.dumps(body | {"nodes": 100}))
        argv[-1] = str(too_big)
        code, out, err = run_cli([*argv, "--token-file", str(token)], capsys)
        assert code == 1 and json.loads(out)["options"] == []


def ask_as(api: httpx.Client, who: str, request: Any, templates: Any) -> dict[str, Any]:
    response = api.post(
        "/v1/what-if", json={"request": request, "templates": templates}, headers=bearer(who)
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_cli_bad_input_is_exit_2_and_no_scheduler_is_exit_3(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    request = EXAMPLES / "request.json"
    templates = tmp_path / "templates.json"
    templates.write_text(json.dumps([{"name": "x", "cost": -2}]))
    down = f"http://127.0.0.1:{free_port()}"
    base = ["what-if", "--scheduler", down, "--templates"]
    code, _, err = run_cli([*base, str(templates), str(request)], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "template 'x': cost must be a number >= 0, got -2" in err
    code, _, err = run_cli([*base, str(tmp_path / "none.json"), str(request)], capsys)
    assert code == 2 and "--templates" in err and "cannot read it" in err
    templates.write_text(json.dumps({"templates": []}))
    code, _, err = run_cli([*base, str(templates), str(templates)], capsys)
    assert code == 2 and "request: " in err
    code, _, err = run_cli([*base, str(templates), str(request)], capsys)
    assert code == 3 and err.count("\n") == 1 and down in err
    code, _, err = run_cli(["what-if", "--templates", str(templates), str(request),
                            "--scheduler", "ftp://x"], capsys)  # fmt: skip
    assert code == 2 and "--scheduler 'ftp://x'" in err


# --------------------------------------------------------------------------- fuzz


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """The API on SQLite with two nodes, for the fuzz test."""
    root = tmp_path_factory.mktemp("whatif-fuzz")
    with open_store("sqlite", root) as opened, client_for(opened) as api:
        put_agent(api, "h200-0", agent_body(H200_R570, 4))
        put_agent(api, "a100-0", agent_body(A100_R535, 2))
        yield api


VALID = {
    "request": {"index": AMD64_ONLY, "nodes": 3, "devices_per_node": 2},
    "templates": [
        template("h200", H200_R570, 2, max_nodes=4, cost=2.5),
        template("gh200", H200_R570, 1, host=GRACE, platform="linux/arm64"),
    ],
}


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(change=MUTATIONS)
def test_any_what_if_body(fuzzed: httpx.Client, change: tuple[list[int], Any]) -> None:
    """A mutated body is answered 200 or a one-line 400, never a 500."""
    response = fuzzed.post("/v1/what-if", content=json.dumps(_mutate(VALID, *change)))
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        error_message(response)
    else:
        assert set(response.json()) == {"fits_now", "variant", "options", "cheapest", "reasons"}
