"""``GET /ui``, the fleet view: the matrix is ``select``'s, escaping, tokens, the registry
allow-list, and a real headless Chromium on a 20-agent pool (with a screenshot kept).

The scheduler runs under uvicorn in the test process (tests/test_scheduler_support.py);
Chromium (Debian ``chromium`` + ``chromium-driver``) is driven by selenium.
"""

from __future__ import annotations

import base64
import json
import shutil
import urllib.parse
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest

from docker_variant.oci.reference import Reference
from docker_variant.scheduler import Store
from docker_variant.scheduler.tokens import TokenTable, load_tokens
from docker_variant.variant.index import VariantIndex
from docker_variant.variant.selection import select
from test_scheduler_support import (
    A100_R535,
    B200_R580,
    H200_R570,
    INDEX,
    L4_R535,
    X86_V3,
    X86_V4,
    SchedulerServer,
    agent_body,
    gpu_lists,
)

ARTIFACTS = Path("/tmp/docker-variant-artifacts")


class Cells(HTMLParser):
    """The ``#matrix`` table as {row title: {variant: (class, text)}}, and every table's
    rows as text, from the served HTML (no browser needed)."""

    def __init__(self) -> None:
        super().__init__()
        self.matrix: dict[str, dict[str, tuple[str, str]]] = {}
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._variant: tuple[str, str] | None = None
        self._title: str | None = None
        self._in_details = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "table":
            self._table = attributes.get("id") or ""
            self.tables[self._table] = []
        elif tag == "tr":
            self._row, self._title = [], None
        elif tag in ("td", "th"):
            self._cell = []
            variant = attributes.get("data-variant")
            self._variant = (variant, attributes.get("class") or "") if variant else None
        elif tag == "details":
            self._in_details += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "details":
            self._in_details -= 1
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            text = " ".join("".join(self._cell).split())
            self._row.append(text)
            if self._table == "matrix" and tag == "th" and len(self._row) == 1:
                self._title = text
            if self._table == "matrix" and tag == "td" and self._variant and self._title:
                variant, css = self._variant
                self.matrix.setdefault(self._title, {})[variant] = (css, text)
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table is not None:
            self.tables[self._table].append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None and not self._in_details:
            self._cell.append(data)


def parse(page: str) -> Cells:
    cells = Cells()
    cells.feed(page)
    return cells


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store.open(f"sqlite:///{tmp_path / 'scheduler.db'}")
    yield opened
    opened.close()


def put(url: str, agent_id: str, body: dict[str, Any], token: str | None = None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.put(f"{url}/v1/agents/{agent_id}", json=body, headers=headers)
    assert response.status_code == 200, response.text


FLEET = [  # (agent id prefix, GPU, count of agents, host lists)
    ("h200", H200_R570, 8, X86_V4),
    ("a100", A100_R535, 6, X86_V4),
    ("l4", L4_R535, 2, X86_V3),
    ("b200", B200_R580, 2, X86_V4),
    ("cpu", None, 2, X86_V3),
]


def fill(url: str) -> dict[str, dict[str, Any]]:
    """20 agents: H200s, A100s, L4s, B200s with 4 GPUs each, and CPU-only hosts; their
    heartbeat bodies by agent id."""
    bodies = {}
    for prefix, gpu, count, host in FLEET:
        for i in range(count):
            name = f"{prefix}-{i}"
            bodies[name] = agent_body(gpu, 4, host=host)
            put(url, name, bodies[name])
    assert len(bodies) == 20
    return bodies


def expected_first_choice(gpu: Any, host: dict[str, Any]) -> str:
    """What ``select`` itself ranks first on a device's merged lists."""
    lists = {**host, **(gpu_lists(gpu) if gpu else {})}
    best = select(VariantIndex.from_json(INDEX, "INDEX"), lists).best
    assert best is not None
    return best.label or "(bare)"


def test_the_matrix_is_what_select_says_for_each_device_class(store: Store) -> None:
    with SchedulerServer(store) as server:
        fill(server.url)
        page = httpx.get(f"{server.url}/ui", params={"index": json.dumps(INDEX)})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    cells = parse(page.text)
    # one row per class: the GPU kinds (H200 and B200 hosts share x86 v4) and CPU-only hosts
    titles = sorted(cells.matrix)
    assert len(titles) == 5, titles
    row = {
        "h200": next(t for t in titles if "sm 9.0" in t),
        "a100": next(t for t in titles if "sm 8.0" in t),
        "l4": next(t for t in titles if "sm 8.9" in t),
        "b200": next(t for t in titles if "sm 10.0" in t),
        "cpu": next(t for t in titles if t.startswith("(host only)")),
    }
    for prefix, gpu, _, host in FLEET:
        first = [v for v, (css, _) in cells.matrix[row[prefix]].items() if css == "first"]
        assert first == [expected_first_choice(gpu, host)], (prefix, cells.matrix[row[prefix]])
    assert cells.matrix[row["h200"]]["cu128"] == ("first", "runs this")
    assert cells.matrix[row["a100"]]["cu122"] == ("first", "runs this")
    assert cells.matrix[row["b200"]]["cu130"] == ("first", "runs this")
    assert cells.matrix[row["cpu"]]["v3"] == ("first", "runs this")
    # a cell that does not fit carries select's own reason
    index = VariantIndex.from_json(INDEX, "INDEX")
    a100 = {**X86_V4, **gpu_lists(A100_R535)}
    reason = next(c.reason for c in select(index, a100).rejected if c.label == "cu128")
    assert reason and cells.matrix[row["a100"]]["cu128"] == ("no", reason)
    assert cells.matrix[row["h200"]]["null"][0] == "fits"
    fleet = cells.tables["fleet"]
    h200 = next(r for r in fleet if r[1].startswith("sm 9.0"))
    assert h200[2] == "CUDA 12.8 (R570)" and h200[6:9] == ["32", "32", "0"]


def test_everything_from_outside_is_escaped(store: Store) -> None:
    script = "<script>alert(1)</script>"
    index = json.loads(json.dumps(INDEX))
    # invalid entries' tags and errors are free text: a scan quotes what it found
    index["invalid"] = [{"tag": f"2.0-{script}", "error": f"label {script} is not valid"}]
    with SchedulerServer(store) as server:
        # ids cannot carry markup at all: the API refuses them before they are stored
        refused = httpx.put(f"{server.url}/v1/agents/{script}", json=agent_body(H200_R570))
        assert refused.status_code in (400, 404)
        put(server.url, "node", agent_body(H200_R570))
        typed = httpx.get(f"{server.url}/ui", params={"image": f"{script}:1"})
        shown = httpx.post(
            f"{server.url}/ui",
            data={"index": json.dumps(index)},
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
    for page in (typed, shown):
        assert page.status_code == 200
        assert "<script" not in page.text.lower(), page.text
        assert "script-src" not in page.headers["content-security-policy"]
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in typed.text  # in the form and the error
    assert "id=lookup-error" in typed.text
    escaped = script.replace("<", "&lt;").replace(">", "&gt;")
    assert f"<code>2.0-{escaped}</code>: label {escaped} is not valid" in shown.text
    assert parse(shown.text).matrix  # the index itself was judged


def test_one_agent_with_5000_digit_values_breaks_the_page_for_nobody(store: Store) -> None:
    """Values no vendor rule can read (5,000 digits: past Python's int-string limit) are
    shown as they are, shortened in a title and whole in the lists, and every other device
    class is still judged."""
    big = "9" * 5000
    odd = {
        "nvidia": {"sm_arch": [f"{big}_real"], "cuda_version_lower_bound": [f"1{big}"]},
        "amd": {"gfx_arch": [f"gfx{big}"], "rocm_version": [f"{big}.1"]},
        "furiosa": {"arch": [f"warboy_{big}"], "driver_version": [big]},
    }
    with SchedulerServer(store) as server:
        put(server.url, "good", agent_body(H200_R570, 2))
        for namespace, lists in odd.items():
            body = {
                "resource_group": "default",
                "host": X86_V4,
                "devices": {namespace: {"d0": {namespace: lists}}},
            }
            put(server.url, f"odd-{namespace}", body)
        pages = [
            httpx.get(f"{server.url}/ui"),
            httpx.get(f"{server.url}/ui", params={"index": json.dumps(INDEX)}),
        ]
    for page in pages:
        assert page.status_code == 200, page.text[:500]
        assert f"<code>furiosa :: arch :: warboy_{big}</code>" in page.text
    fleet = parse(pages[0].text).tables["fleet"]
    products = {row[0]: row[1] for row in fleet[1:]}
    assert products["nvidia"] == "9" * 37 + "..."  # the title shortens what it cannot read
    assert products["amd"] == "gfx" + "9" * 34 + "..."
    assert products["furiosa"] == "furiosa warboy_" + "9" * 30 + "..."
    assert products["cuda"] == "sm 9.0 (H100, H200, GH200)"
    matrix = parse(pages[1].text).matrix
    h200 = next(title for title in matrix if "sm 9.0" in title)
    assert matrix[h200]["cu128"] == ("first", "runs this")


HOST_ROOTS = Path(__file__).parent / "fixtures" / "hostroot"
DESCRIPTORS = Path(__file__).parents[1] / "examples" / "providers.d"


def accelerator_index() -> dict[str, Any]:
    """An index with a build per accelerator: MI300X (gfx942), Navi 31 (gfx1100), Warboy,
    CUDA 12.8, and x86-64 v3."""
    variants = {
        "rocm64": {"amd": {"gfx_arch": ["gfx942"], "rocm_version": ["6.4"]}},
        "rocm64navi": {"amd": {"gfx_arch": ["gfx1100"], "rocm_version": ["6.4"]}},
        "warboy": {"furiosa": {"arch": ["warboy"]}},
        "cu128": INDEX["variants"]["cu128"],
        "v3": INDEX["variants"]["v3"],
    }
    return {
        "default-priorities": {"namespace": ["amd", "furiosa", "nvidia", "x86_64"]},
        "variants": variants,
        "images": {
            label: {"tag": f"2.0-{label}", "digest": "sha256:" + f"{i:x}" * 64}
            for i, label in enumerate(variants, 1)
        },
        "bare": None,
        "invalid": [],
    }


def test_amd_gpus_and_npus_show_with_their_products(
    store: Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Heartbeats as the agent sends them from an MI300X host, an MI210 + Navi 31 host and a
    Warboy host (sysfs fixtures, the example descriptor) beside an H200 node: each device
    class is named by its vendor's product, and each runs its own vendor's build."""
    from docker_variant.agent.node import Agent, AgentSettings

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("DOCKER_VARIANT_PROVIDERS_FILE", raising=False)
    with SchedulerServer(store) as server:
        put(server.url, "h200", agent_body(H200_R570, 2))
        for host in ("mi300x", "mi210-navi31", "warboy"):
            settings = AgentSettings(
                server.url, host, host_root=HOST_ROOTS / host, descriptors=DESCRIPTORS
            )
            agent = Agent(settings)
            agent.beat()
            agent.close()
        page = httpx.get(f"{server.url}/ui", params={"index": json.dumps(accelerator_index())})
    assert page.status_code == 200, page.text[:500]
    cells = parse(page.text)
    fleet = {row[1].split(" (")[0]: row for row in cells.tables["fleet"][1:]}
    assert sorted(fleet) == ["furiosa warboy", "gfx1100", "gfx90a", "gfx942", "sm 9.0"]
    # a device's lists name its gfx target, and the target's products are named after it
    assert fleet["gfx942"][1].startswith("gfx942 (Instinct MI300A, MI300X")
    assert fleet["gfx942"][0] == "amd"
    assert fleet["gfx942"][2] == "ROCm 6.4" and fleet["gfx942"][6] == "8"  # the host's ROCm
    assert "MI210" in fleet["gfx90a"][1] and fleet["gfx90a"][6] == "1"
    assert "Radeon RX 7900 XT" in fleet["gfx1100"][1] and fleet["gfx1100"][2] == "ROCm 7.0"
    warboy = fleet["furiosa warboy"]
    assert warboy[0] == "furiosa" and warboy[2] == "driver version 1.9.2" and warboy[6] == "2"
    runs = {
        title.split(": ", 1)[1].split(" (")[0]: [v for v, (css, _) in row.items() if css == "first"]
        for title, row in cells.matrix.items()
    }
    assert runs == {
        "gfx942": ["rocm64"],
        "gfx1100": ["rocm64navi"],
        "gfx90a": ["v3"],  # no build for it: the CPU build
        "furiosa warboy, driver version 1.9.2linux/amd64": ["warboy"],
        "sm 9.0": ["cu128"],
    }, runs


def test_a_host_with_gpus_of_two_vendors_names_each_device_by_its_own(store: Store) -> None:
    """An H200 beside an MI300X on one host: the host's lists name both vendors, each
    device's lists one; each fleet class and matrix row is named by the device's."""
    mi300x = {"amd": {"gfx_arch": ["gfx942"], "rocm_version": ["6.4", "6.3"]}}
    h200 = gpu_lists(H200_R570)
    body = {
        "resource_group": "default",
        "host": {**X86_V4, **h200, **mi300x},
        "devices": {"nvidia": {"GPU-0": h200}, "amd": {"0000:05:00.0": mi300x}},
    }
    with SchedulerServer(store) as server:
        put(server.url, "mixed", body)
        page = httpx.get(f"{server.url}/ui", params={"index": json.dumps(accelerator_index())})
    cells = parse(page.text)
    products = sorted(row[1].split(" (")[0] for row in cells.tables["fleet"][1:])
    assert products == ["gfx942", "sm 9.0"]
    titles = sorted(title.split(" (")[0] for title in cells.matrix)
    assert titles == ["amd: gfx942", "nvidia: sm 9.0"], titles


def write_tokens(path: Path) -> TokenTable:
    path.write_text(
        '[[token]]\nrole = "client"\nname = "ci"\ntoken = "client-token-0123456789"\n'
        '[[token]]\nrole = "client"\nname = "other"\ntoken = "other-token-0123456789"\n'
        '[[token]]\nrole = "agent"\nagent_id = "node"\ntoken = "agent-token-0123456789"\n'
    )
    return load_tokens(path)


def basic(token: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"me:{token}".encode()).decode()}


def test_the_page_takes_the_api_tokens(store: Store, tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens.toml")
    with SchedulerServer(store, tokens=tokens) as server:
        url = server.url
        put(url, "node", agent_body(H200_R570, 2), token="agent-token-0123456789")
        body = {"index": INDEX, "nodes": 1, "devices_per_node": 1}
        mine = httpx.post(
            f"{url}/v1/placements",
            json=body,
            headers={"Authorization": "Bearer client-token-0123456789"},
        ).json()["id"]
        theirs = httpx.post(
            f"{url}/v1/placements",
            json=body,
            headers={"Authorization": "Bearer other-token-0123456789"},
        ).json()["id"]

        anonymous = httpx.get(f"{url}/ui")
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"] == 'Basic realm="variant-scheduler"'
        assert httpx.get(f"{url}/ui", headers=basic("wrong-token-0123456789")).status_code == 401
        assert httpx.get(f"{url}/ui", headers=basic("agent-token-0123456789")).status_code == 403
        # the API itself still asks for a bearer token, and takes no Basic password
        assert (
            httpx.get(f"{url}/v1/placements", headers=basic("client-token-0123456789")).status_code
            == 401
        )

        for headers in (
            {"Authorization": "Bearer client-token-0123456789"},
            basic("client-token-0123456789"),
        ):
            page = httpx.get(f"{url}/ui", headers=headers)
            assert page.status_code == 200
            assert mine[:12] in page.text and theirs[:12] not in page.text  # own placements


def test_registry_lookups_obey_the_allow_list(store: Store, tmp_path: Path) -> None:
    asked: list[str] = []

    def fetch(reference: str | Reference) -> tuple[Reference, VariantIndex]:
        asked.append(str(reference))
        assert isinstance(reference, Reference)
        return reference, VariantIndex.from_json(INDEX, "INDEX")

    tokens = write_tokens(tmp_path / "tokens.toml")
    client = {"Authorization": "Bearer client-token-0123456789"}
    with SchedulerServer(store, fetch, tokens=tokens, registries=["registry.example:5000"]) as s:
        put(s.url, "node", agent_body(H200_R570, 2), token="agent-token-0123456789")
        refused = httpx.get(f"{s.url}/ui", params={"image": "169.254.169.254/x:1"}, headers=client)
        allowed = httpx.get(
            f"{s.url}/ui", params={"image": "registry.example:5000/app:2.0"}, headers=client
        )
    assert refused.status_code == 200
    message = "registry '169.254.169.254' is not one this scheduler may contact"
    assert message.replace("'", "&#39;") in refused.text  # in the lookup error, escaped
    assert asked == ["registry.example:5000/app:2.0"]
    assert parse(allowed.text).matrix and "sm 9.0" in next(iter(parse(allowed.text).matrix))


# --------------------------------------------------------------------------- Chromium


@pytest.fixture
def chromium() -> Iterator[Any]:
    for binary in ("chromium", "chromedriver"):
        if shutil.which(binary) is None:
            pytest.skip(
                f"{binary} is not installed (Debian chromium, chromium-driver: scripts/setup)"
            )
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.add_argument("--window-size=1500,1900")
    driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
    yield driver
    driver.quit()


def test_chromium_shows_the_matrix_and_a_failure_after_a_reload(
    store: Store, chromium: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    with SchedulerServer(store) as server:
        bodies = fill(server.url)
        placed = httpx.post(
            f"{server.url}/v1/placements",
            json={"index": INDEX, "nodes": 2, "devices_per_node": 4, "device_name": "cuda"},
        )
        assert placed.status_code == 201, placed.text
        document = placed.json()
        holder = document["allocations"][0]["agent_id"]
        device = document["allocations"][0]["devices"][0]

        # the form posts the index; the matrix comes back in the page
        chromium.get(f"{server.url}/ui")
        assert chromium.title == "variant-scheduler fleet"
        chromium.find_element(By.NAME, "index").send_keys(json.dumps(INDEX))
        chromium.find_element(By.CSS_SELECTOR, "form:not(.cordon) button").click()
        WebDriverWait(chromium, 30).until(
            expected_conditions.presence_of_element_located((By.ID, "matrix"))
        )
        rows = chromium.find_elements(By.CSS_SELECTOR, "#matrix tr")
        assert len(rows) == 1 + 5  # header and five device classes
        first = {
            row.find_element(By.TAG_NAME, "th").text.splitlines()[0]: [
                cell.get_attribute("data-variant")
                for cell in row.find_elements(By.CSS_SELECTOR, "td.first")
            ]
            for row in rows[1:]
        }
        by_product = {title.split(": ", 1)[-1].split(",")[0]: v for title, v in first.items()}
        assert by_product == {
            "sm 10.0 (B200": ["cu130"],
            "sm 8.0 (A100)": ["cu122"],
            "sm 8.9 (L4": ["cu122"],
            "sm 9.0 (H100": ["cu128"],
            "(host only)": ["v3"],
        }, first
        placement_row = chromium.find_element(By.CSS_SELECTOR, f"tr[data-id='{document['id']}']")
        assert placement_row.find_element(By.CLASS_NAME, "state").text == "active"
        assert chromium.find_element(By.ID, "unhealthy").text == "0 unhealthy"

        # the same page by its address (the index as a query parameter), reloaded after a
        # heartbeat reports one of the gang's GPUs unhealthy
        chromium.get(f"{server.url}/ui?{urllib.parse.urlencode({'index': json.dumps(INDEX)})}")
        assert len(chromium.find_elements(By.CSS_SELECTOR, "#matrix tr")) == 6
        body = {**bodies[holder], "unhealthy": {"cuda": [device]}}
        put(server.url, holder, body)
        chromium.refresh()
        assert chromium.find_element(By.ID, "unhealthy").text == "1 unhealthy"
        placement_row = chromium.find_element(By.CSS_SELECTOR, f"tr[data-id='{document['id']}']")
        state = placement_row.find_element(By.CLASS_NAME, "state").text
        assert state.startswith("degraded"), state
        assert len(chromium.find_elements(By.CSS_SELECTOR, "#matrix tr")) == 6

        shot = tmp_path / "fleet-view.png"
        assert chromium.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    kept = ARTIFACTS / "fleet-view.png"
    shutil.copyfile(shot, kept)
    print(f"\nfleet view screenshot: {kept}")


def test_every_host_is_listed_with_its_problems_first(tmp_path: Path) -> None:
    """A host without devices, a stale one and one with an unhealthy GPU are listed, first
    and marked; a plain GET reloads itself (meta refresh), a posted index does not."""
    clock = [1_000_000.0]
    opened = Store.open(f"sqlite:///{tmp_path / 'hosts.db'}", agent_ttl=90, clock=lambda: clock[0])
    try:
        with SchedulerServer(opened) as server:
            put(server.url, "old-a100", agent_body(A100_R535, 2))
            clock[0] += 120  # old-a100 is stale now
            for i in range(3):
                put(server.url, f"h200-{i}", agent_body(H200_R570, 4))
            put(server.url, "cpu-only", agent_body(None))
            sick = agent_body(H200_R570, 4) | {"unhealthy": {"cuda": ["GPU-1"]}}
            put(server.url, "h200-sick", sick)
            page = httpx.get(f"{server.url}/ui").text
            posted = httpx.post(f"{server.url}/ui", data={"index": json.dumps(INDEX)}).text
    finally:
        opened.close()
    rows = parse(page).tables["hosts"][1:]
    assert [row[0] for row in rows] == [
        "cpu-only", "h200-sick", "old-a100", "h200-0", "h200-1", "h200-2"]  # fmt: skip
    state = {row[0]: row[2] for row in rows}
    assert state["cpu-only"] == "alive (no devices reported)"
    assert state["h200-sick"] == "alive (1 unhealthy)"
    assert state["old-a100"] == "stale"
    assert rows[3][4] == "cuda: 4 / 0"
    assert '<meta http-equiv="refresh" content="30">' in page
    assert "http-equiv" not in posted
