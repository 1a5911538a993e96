"""Cordon (issue 42): an admin stops new placements on an agent, through the API, the
``variant-scheduler cordon`` command and the ``/ui`` page. A cordoned agent keeps reporting and
stays listed; a drained one (``DELETE``) that reports again stays cordoned until uncordoned.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from clirun import run_in_process
from docker_variant.scheduler import Store
from docker_variant.scheduler.__main__ import main
from docker_variant.scheduler.tokens import load_tokens
from test_scheduler_support import H200_R570, INDEX, SchedulerServer, agent_body

ADMIN, CLIENT = "admin-token-0123456789", "client-token-0123456789"
AGENTS = {"node-a": "agent-a-token-0123456789", "node-b": "agent-b-token-0123456789"}
TOKENS = (
    f'[[token]]\nrole = "admin"\nname = "ops"\ntoken = "{ADMIN}"\n'
    f'[[token]]\nrole = "client"\nname = "ci"\ntoken = "{CLIENT}"\n'
    + "".join(
        f'[[token]]\nrole = "agent"\nagent_id = "{a}"\ntoken = "{t}"\n' for a, t in AGENTS.items()
    )
)
GANG_OF_TWO = {"index": INDEX, "nodes": 2, "devices_per_node": 1}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def report(url: str, agent_id: str) -> dict[str, Any]:
    answer = httpx.put(
        f"{url}/v1/agents/{agent_id}",
        json=agent_body(H200_R570, 1),
        headers=bearer(AGENTS[agent_id]),
    )
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def cordoned(url: str) -> dict[str, bool]:
    agents = httpx.get(f"{url}/v1/agents", headers=bearer(ADMIN)).json()["agents"]
    return {a["agent_id"]: a["cordoned"] for a in agents}


def place(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/placements", json=body, headers=bearer(CLIENT))


def fits_now(url: str, body: dict[str, Any]) -> bool:
    question = {"request": body, "templates": []}
    answer = httpx.post(f"{url}/v1/what-if", json=question, headers=bearer(CLIENT))
    assert answer.status_code == 200, answer.text
    return bool(answer.json()["fits_now"])


@pytest.fixture
def server(tmp_path: Path) -> Any:
    (tmp_path / "tokens.toml").write_text(TOKENS)
    store = Store.open(f"sqlite:///{tmp_path / 'scheduler.db'}")
    with SchedulerServer(store, tokens=load_tokens(tmp_path / "tokens.toml")) as running:
        for agent_id in AGENTS:
            report(running.url, agent_id)
        yield running
    store.close()


def test_a_cordoned_agent_reports_but_takes_no_placement(server: Any, tmp_path: Path) -> None:
    url = server.url
    assert fits_now(url, GANG_OF_TWO)
    refused = httpx.post(f"{url}/v1/agents/node-b/cordon", headers=bearer(CLIENT))
    assert refused.status_code == 403
    unknown = httpx.post(f"{url}/v1/agents/node-z/cordon", headers=bearer(ADMIN))
    assert unknown.status_code == 404

    answer = httpx.post(f"{url}/v1/agents/node-b/cordon", headers=bearer(ADMIN))
    assert answer.status_code == 200
    assert answer.json() == {"agent_id": "node-b", "cordoned": True, "changed": True}
    assert cordoned(url) == {"node-a": False, "node-b": True}
    assert report(url, "node-b")["cordoned"] is True  # its heartbeats are still taken
    assert not fits_now(url, GANG_OF_TWO)  # what-if skips it as placing does
    refusal = place(url, GANG_OF_TWO)
    assert refusal.status_code == 409
    assert "cordoned" in refusal.text
    one = place(url, {"index": INDEX, "nodes": 1, "devices_per_node": 1})
    assert one.status_code == 201
    assert [a["agent_id"] for a in one.json()["allocations"]] == ["node-a"]

    # kept in the database: a scheduler started again on it still skips node-b
    again = Store.open(f"sqlite:///{tmp_path / 'scheduler.db'}")
    try:
        assert {v["agent_id"]: v["cordoned"] for v in again.list_agents()}["node-b"] is True
        pool = again.snapshot()
        assert [n.agent_id for n in pool.nodes] == ["node-a"]
        assert "cordoned" in pool.unavailable["node-b"]
    finally:
        again.close()

    answer = httpx.post(f"{url}/v1/agents/node-b/uncordon", headers=bearer(ADMIN))
    assert answer.json() == {"agent_id": "node-b", "cordoned": False, "changed": True}
    assert cordoned(url) == {"node-a": False, "node-b": False}
    assert place(url, {"index": INDEX, "nodes": 1, "devices_per_node": 1}).status_code == 201


def test_a_drained_agent_that_reports_again_stays_cordoned(server: Any) -> None:
    url = server.url
    assert place(url, GANG_OF_TWO).status_code == 201
    drained = httpx.delete(f"{url}/v1/agents/node-b", headers=bearer(ADMIN))
    assert drained.status_code == 200
    assert len(drained.json()["placements_deleted"]) == 1
    assert "node-b" not in cordoned(url)

    report(url, "node-b")  # its agent's next heartbeat, as in issue 42
    assert cordoned(url) == {"node-a": False, "node-b": True}
    assert place(url, GANG_OF_TWO).status_code == 409

    httpx.delete(f"{url}/v1/agents/node-b", headers=bearer(ADMIN))
    # gone and cordoned: it can be uncordoned before it comes back
    answer = httpx.post(f"{url}/v1/agents/node-b/uncordon", headers=bearer(ADMIN))
    assert answer.json()["changed"] is True
    report(url, "node-b")
    assert place(url, GANG_OF_TWO).status_code == 201


def test_the_cordon_commands(
    server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    admin, client = tmp_path / "admin.token", tmp_path / "client.token"
    admin.write_text(ADMIN + "\n")
    client.write_text(CLIENT)
    given = ["--scheduler", server.url, "--token-file", str(admin)]

    assert run_in_process(main, ["cordon", *given, "node-b"], capsys)[0] == 0
    assert cordoned(server.url)["node-b"] is True
    assert main(["cordon", *given, "node-b"]) == 0
    assert capsys.readouterr().out == "agent node-b: already cordoned\n"

    code, err = run_in_process(main, ["cordon", *given, "node-z"], capsys)
    assert (code, err) == (3, "variant-scheduler: error: 404 no agent 'node-z'\n")
    code, err = run_in_process(
        main, ["cordon", "--scheduler", server.url, "--token-file", str(client), "node-a"], capsys
    )
    assert code == 2 and "needs the admin role" in err
    code, err = run_in_process(main, ["cordon", *given, "../x"], capsys)
    assert code == 2 and "'../x'" in err

    assert main(["uncordon", *given, "node-b"]) == 0
    assert capsys.readouterr().out == "agent node-b: uncordoned\n"
    assert cordoned(server.url)["node-b"] is False


def basic(token: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"me:{token}".encode()).decode()}


def test_the_page_cordons_with_a_form_key_only_an_admin_has(server: Any) -> None:
    url = server.url
    page = httpx.get(f"{url}/ui", headers=basic(ADMIN)).text
    forms = re.findall(r'<form class="cordon".*?</form>', page)
    assert len(forms) == 2
    assert 'action="ui/cordon"' in forms[0]
    key = re.findall(r'name="form_key" value="([0-9a-f]{64})"', page)[0]
    assert "ui/cordon" not in httpx.get(f"{url}/ui", headers=basic(CLIENT)).text

    form = {"agent_id": "node-b", "action": "cordon", "form_key": key}
    for headers, fields, status in (
        (basic(CLIENT), form, 403),  # a client may not
        (basic(ADMIN), {**form, "form_key": "0" * 64}, 403),  # a forged form lacks the key
        (basic(ADMIN) | {"Origin": "https://evil.example"}, form, 403),
        (basic(ADMIN) | {"Sec-Fetch-Site": "cross-site"}, form, 403),
        (basic(ADMIN), {**form, "agent_id": "node-z"}, 404),
    ):
        answer = httpx.post(f"{url}/ui/cordon", data=fields, headers=headers)
        assert answer.status_code == status, (headers, fields, answer.text)
    assert cordoned(url)["node-b"] is False

    done = httpx.post(f"{url}/ui/cordon", data=form, headers=basic(ADMIN) | {"Origin": url})
    assert done.status_code == 303 and done.headers["location"] == "../ui"
    assert cordoned(url)["node-b"] is True
    page = httpx.get(f"{url}/ui", headers=basic(ADMIN)).text
    row = re.search(r'<tr[^>]*data-agent="node-b".*?</tr>', page, re.S)
    assert row is not None and "cordoned" in row.group(0) and ">Uncordon<" in row.group(0)

    form["action"] = "uncordon"
    assert httpx.post(f"{url}/ui/cordon", data=form, headers=basic(ADMIN)).status_code == 303
    assert cordoned(url)["node-b"] is False
