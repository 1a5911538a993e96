"""``docker-variant k8s gang``: one variant for every pod of a multi-node job.

- Pure: the gang planned on the cluster fixtures (the scheduler's planner, fed from
  ResourceSlices and claims), its objects, its refusals, and 50 randomised clusters (seeded;
  the seed is printed) on which no gang ever mixes variants or products where one product
  can take it, every chosen device is free and fits, and the printed selectors admit no
  device the variant does not fit.
- On the real v1.37.2 control plane (``pytest.mark.kube``): a plain Job with the
  ``k8s claim`` template gets different variants on H100 and A100 nodes; the same 4 pods from
  ``k8s gang`` land on one kind of node with one variant, or stay pending all together
  while only 3 nodes of that kind are free; and a few random clusters, bound for real.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import kubeplane
from docker_variant.cli.k8s import K8S_MAX_PODS
from docker_variant.k8s.gang import (
    MAX_PODS,
    Gang,
    cluster_objects,
    gang_objects,
    plan_gang,
    read_cluster,
)
from docker_variant.planner.placement import Refusal
from docker_variant.variant import VariantIndex, select
from docker_variant.vendors import nvidia
from k8s_cel_env import matches
from k8sfixtures import class_selectors, devices

REPO = Path(__file__).resolve().parent.parent
PYTORCH = REPO / "examples" / "pytorch-2.12.0.json"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "k8s"
DOCS = REPO / "docs" / "reference" / "kubernetes.md"
INDEX = VariantIndex.from_json(json.loads(PYTORCH.read_text()), "pytorch")
DIGEST = "sha256:" + "c" * 64


def fixture(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((FIXTURES / f"{name}.yaml").read_text()) if d]


def renamed(name: str, new: str) -> list[dict[str, Any]]:
    """A fixture node's Node and ResourceSlices under another node (and pool) name."""
    out = []
    for obj in fixture(name):
        obj = copy.deepcopy(obj)
        if obj["kind"] == "Node":
            obj["metadata"]["name"] = new
            obj["metadata"]["labels"]["kubernetes.io/hostname"] = new
        else:
            obj["metadata"]["name"] = obj["metadata"]["name"].replace(name, new, 1)
            obj["spec"]["nodeName"] = new
            obj["spec"]["pool"]["name"] = new
        out.append(obj)
    return out


def cluster(h100: int, a100: int) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    for i in range(h100):
        objs += renamed("h100-cuda128", f"h100-{i}")
    for i in range(a100):
        objs += renamed("a100-cuda126", f"a100-{i}")
    return objs


def pinned_index(tmp_path: Path) -> Path:
    """The pytorch example with a digest for every image."""
    document = json.loads(PYTORCH.read_text())
    for i, image in enumerate(document["images"].values()):
        image["digest"] = "sha256:" + f"{i:x}" * 64
    document["images"]["cu128"]["digest"] = DIGEST
    path = tmp_path / "pytorch-2.12.0.json"
    path.write_text(json.dumps(document))
    return path


def dump(tmp_path: Path, objs: list[dict[str, Any]], name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objs}))
    return path


def fits(lists: dict[str, Any], label: str | None) -> bool:
    return label in {c.label for c in select(INDEX, lists).ranked}


# --- pure: the plan and the objects --------------------------------------------------------


def test_the_cli_bound_is_the_modules() -> None:
    assert K8S_MAX_PODS == MAX_PODS


def test_a_gang_of_4_on_4_h100_and_2_a100_is_pinned_to_cu128_on_h100(tmp_path: Path) -> None:
    index = pinned_index(tmp_path)
    done = kubeplane.cli(
        "k8s", "gang", "--index", str(index), "--image", "registry.example.com/pytorch",
        "--pods", "4", "--count", "8", "--cluster", str(dump(tmp_path, cluster(4, 2))),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    template, workload, group, job = list(yaml.safe_load_all(done.stdout))
    assert [o["kind"] for o in (template, workload, group, job)] == [
        "ResourceClaimTemplate", "Workload", "PodGroup", "Job",
    ]  # fmt: skip
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["count"] == 8
    expressions = [s["cel"]["expression"] for s in request["exactly"]["selectors"]]
    assert any('== "NVIDIA H100 80GB HBM3"' in e for e in expressions)
    annotations = template["spec"]["metadata"]["annotations"]
    assert json.loads(annotations["variant.pep817.dev/subrequests"]) == {"gpu": ["cu128"]}
    assert workload["spec"]["podGroupTemplates"][0]["schedulingPolicy"] == {"gang": {"minCount": 4}}
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 4}}
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 4, 4)
    pod = spec["template"]["spec"]
    assert pod["schedulingGroup"] == {"podGroupName": group["metadata"]["name"]}
    assert pod["containers"][0]["image"] == f"registry.example.com/pytorch@{DIGEST}"
    assert pod["resourceClaims"] == [
        {"name": "gpus", "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    assert "warning" not in done.stderr


def test_two_a100_nodes_free_gang_of_2_takes_cu126_and_a_refusal_says_why(
    tmp_path: Path,
) -> None:
    objs = cluster(1, 2)
    plan = plan_gang(INDEX, read_cluster(cluster_objects(objs)), 2, 8)
    assert isinstance(plan, Gang)
    assert (plan.label, plan.product) == ("cu126", "NVIDIA A100-SXM4-80GB")
    done = kubeplane.cli(
        "k8s", "gang", "--index", str(PYTORCH), "--image", "reg.example/pytorch",
        "--pods", "4", "--count", "8", "--cluster", str(dump(tmp_path, objs)),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert "no variant of the index fits a gang of 4 pods with 8 free devices each" in done.stderr
    assert re.search(r"cu126: needs 4 nodes with 8 free devices fitting it", done.stderr)
    assert done.stdout == ""


def test_claimed_devices_are_not_free(tmp_path: Path) -> None:
    objs = cluster(4, 0)
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "taken", "namespace": "other"},
        "spec": {},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.nvidia.com",
                            "pool": "h100-3",
                            "device": "gpu-5",
                        }
                    ]
                }
            }
        },
    }
    state = read_cluster(cluster_objects([*objs, claim]))
    assert ("h100-3", "gpu.nvidia.com", "h100-3/gpu-5") in state.allocated
    assert isinstance(plan_gang(INDEX, state, 4, 8), Refusal)
    assert isinstance(plan_gang(INDEX, state, 4, 7), Gang)


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [\n")
    done = kubeplane.cli(
        "k8s", "gang", "--index", str(PYTORCH), "--image", "r.example/p", "--cluster", str(bad)
    )
    assert done.returncode == 2 and "not YAML or JSON" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    done = kubeplane.cli("k8s", "gang", "--index", str(PYTORCH), "--cluster", str(bad))
    assert done.returncode == 2 and "--index needs --image" in done.stderr


# --- 50 randomised clusters ----------------------------------------------------------------

PRODUCTS = [  # (productName, CUDA driver, compute capability)
    ("NVIDIA H100 80GB HBM3", "12.8.0", "9.0.0"),
    ("NVIDIA H200", "12.8.0", "9.0.0"),  # the H100's class: only the product tells them apart
    ("NVIDIA H100 80GB HBM3", "12.6.0", "9.0.0"),  # one product, an older driver
    ("NVIDIA A100-SXM4-80GB", "12.6.0", "8.0.0"),
    ("NVIDIA L4", "12.2.0", "8.9.0"),
    ("NVIDIA B200", "13.0.0", "10.0.0"),
]


def random_cluster(rng: random.Random) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    for n in range(rng.randint(2, 9)):
        node = f"n{n}"
        product, cuda, cc = rng.choice(PRODUCTS)
        meta = {"name": node, "labels": {"kubernetes.io/hostname": node,
                "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"}}  # fmt: skip
        objs.append({"apiVersion": "v1", "kind": "Node", "metadata": meta,
                     "spec": {"unschedulable": True} if rng.random() < 0.1 else {}})  # fmt: skip
        gpus = [
            {
                "name": f"gpu-{i}",
                "attributes": {
                    "type": {"string": "gpu" if rng.random() > 0.05 else "mig"},
                    "productName": {"string": product},
                    "cudaDriverVersion": {"version": cuda},
                    "cudaComputeCapability": {"version": cc},
                },
            }
            for i in range(rng.randint(1, 8))
        ]
        objs.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-gpu"},
                "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                         "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                         "devices": gpus},
            }
        )  # fmt: skip
        taken = [g["name"] for g in gpus if rng.random() < 0.2]
        if taken:
            results = [
                {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": d}
                for d in taken
            ]
            objs.append(
                {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": f"{node}-taken", "namespace": "busy"}, "spec": {},
                 "status": {"allocation": {"devices": {"results": results}}}}
            )  # fmt: skip
    return objs


def _device_facts(objs: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[str, dict[str, Any]]]:
    """(node, device id) -> (product, lists) of every whole GPU."""
    facts = {}
    for obj in objs:
        if obj["kind"] != "ResourceSlice":
            continue
        for d in obj["spec"]["devices"]:
            attrs = {k: str(next(iter(v.values()))) for k, v in d["attributes"].items()}
            lists = nvidia.dra_device_lists(attrs)
            if lists is not None:
                key = (obj["spec"]["nodeName"], f"{obj['spec']['pool']['name']}/{d['name']}")
                facts[key] = (attrs["productName"], {"nvidia": lists})
    return facts


def check_gang(objs: list[dict[str, Any]], pods: int, count: int) -> Gang | Refusal:
    """Plan, then check the plan against the cluster by brute force; the plan."""
    state = read_cluster(cluster_objects(objs))
    facts = _device_facts(objs)
    cordoned = {o["metadata"]["name"] for o in objs if o.get("spec", {}).get("unschedulable")}
    free = {
        key: fact
        for key, fact in facts.items()
        if (key[0], "gpu.nvidia.com", key[1]) not in state.allocated and key[0] not in cordoned
    }

    def able(label: str | None, product: str | None) -> int:
        per_node: dict[str, int] = {}
        for (node, _), (prod, lists) in free.items():
            if (product is None or prod == product) and fits(lists, label):
                per_node[node] = per_node.get(node, 0) + 1
        return sum(1 for n in per_node.values() if n >= count)

    labels = [c.label for c in select(INDEX, {}).ranked + select(INDEX, {}).rejected]
    products = {p for p, _ in facts.values()}
    one_product = any(able(lb, p) >= pods for lb in labels for p in products)
    found = plan_gang(INDEX, state, pods, count)
    if isinstance(found, Refusal):
        assert not any(able(lb, None) >= pods for lb in labels), found.reasons
        assert set(INDEX.variants) <= set(found.reasons)
        return found
    allocations = found.plan.allocations
    assert len({a.agent_id for a in allocations}) == pods
    chosen_products = set()
    for a in allocations:
        assert len(a.devices) == count and a.device_name == "gpu.nvidia.com"
        for d in a.devices:
            product, lists = free[(a.agent_id, d.device_id)]  # free: not claimed, not cordoned
            assert fits(lists, found.label), (a.agent_id, d.device_id, found.label)
            chosen_products.add(product)
    assert len(chosen_products) == 1 or not one_product, chosen_products
    assert (found.product is not None) == one_product
    # the objects hold the gang there: their selectors admit only devices that fit the
    # variant (and are of the product), and every chosen device
    (template, *_) = gang_objects(
        INDEX, found, name="g", pods=pods, count=count, repository="r.example/p"
    )
    exactly = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    classes = class_selectors(yaml.safe_load_all((FIXTURES / "deviceclasses.yaml").read_text()))
    expressions = classes[exactly["deviceClassName"]] + [
        s["cel"]["expression"] for s in exactly.get("selectors", [])
    ]
    chosen = {(a.agent_id, d.device_id) for a in allocations for d in a.devices}
    for (node, device), (_, dev) in zip(
        [(n, f"{n}/{d.name}") for n, d in devices(objs)], devices(objs), strict=True
    ):
        admitted = all(matches(e, dev) for e in expressions)
        if (node, device) in chosen:
            assert admitted, (node, device)
        if admitted:
            product, lists = facts[(node, device)]
            assert fits(lists, found.label) and product == (found.product or product)
    return found


def test_50_random_clusters_never_mix_variants_or_products(
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed = int(os.environ.get("GANG_SEED", random.SystemRandom().randrange(1 << 32)))
    with capsys.disabled():
        print(f"\nk8s gang randomised clusters: GANG_SEED={seed}")
    rng = random.Random(seed)
    outcomes: dict[str, int] = {}
    for _ in range(50):
        objs = random_cluster(rng)
        found = check_gang(objs, rng.randint(1, 4), rng.randint(1, 4))
        kind = "refused" if isinstance(found, Refusal) else (
            "one product" if found.product else "mixed products")  # fmt: skip
        outcomes[kind] = outcomes.get(kind, 0) + 1
    with capsys.disabled():
        print(f"k8s gang randomised clusters: {outcomes}")


# --- the docs' commands, verbatim ------------------------------------------------------------


def doc_commands() -> list[str]:
    text = DOCS.read_text()
    section = text[text.index("## `k8s gang") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    return [
        line
        for block in blocks
        for line in block.splitlines()
        if line.startswith("docker-variant ")
    ]


def test_the_docs_gang_commands_run_verbatim() -> None:
    commands = doc_commands()
    assert commands
    for command in commands:
        if "--apply" in command or "--kubeconfig" in command:
            continue  # run on the real control plane below
        done = kubeplane.cli(*shlex.split(command)[1:])
        assert done.returncode == 0, (command, done.stderr)
        kinds = [d["kind"] for d in yaml.safe_load_all(done.stdout)]
        assert kinds == ["ResourceClaimTemplate", "Workload", "PodGroup", "Job"], command


# --- the real control plane ------------------------------------------------------------------


def namespace_of(client: httpx.Client) -> str:
    return client.headers["X-Test-Namespace"]


def load(client: httpx.Client, objs: Iterable[dict[str, Any]]) -> None:
    if not kubeplane.items(client, "DeviceClass"):
        kubeplane.create_all(client, fixture("deviceclasses"))
    for obj in objs:
        if obj["kind"] == "Node":
            kubeplane.make_ready(client, obj)
        elif obj["kind"] == "ResourceSlice":
            kubeplane.create(client, obj)


def job_pods(client: httpx.Client, job: str) -> list[dict[str, Any]]:
    ns = namespace_of(client)
    return [
        p
        for p in kubeplane.items(client, "Pod", ns)
        if p["metadata"].get("labels", {}).get("batch.kubernetes.io/job-name") == job
    ]


def bound(client: httpx.Client, job: str, pods: int) -> list[tuple[str, dict[str, Any]]]:
    """Await every pod of the Job bound with its claim allocated: (node, claim) each."""
    ns = namespace_of(client)

    def read() -> list[tuple[str, dict[str, Any]]] | None:
        found = []
        for p in job_pods(client, job):
            node = p["spec"].get("nodeName")
            statuses = p.get("status", {}).get("resourceClaimStatuses") or []
            if not node or not statuses:
                return None
            claim = kubeplane.get(client, "ResourceClaim", statuses[0]["resourceClaimName"], ns)
            if not claim.get("status", {}).get("allocation"):
                return None
            found.append((node, claim))
        return found if len(found) == pods else None

    return kubeplane.await_value(read, f"the {pods} pods of job {job} to be bound", timeout=90)


def variant_of(claim: dict[str, Any]) -> str:
    mapping = json.loads(claim["metadata"]["annotations"]["variant.pep817.dev/subrequests"])
    results = claim["status"]["allocation"]["devices"]["results"]
    (request,) = {r["request"] for r in results}
    name = request.split("/", 1)[1] if "/" in request else request
    return str(mapping[name][0])


def plain_job(name: str, template: str, pods: int) -> dict[str, Any]:
    """An Indexed Job of ``pods`` pods, one a node, each with a claim from ``template``."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "affinity": {
                        "podAntiAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "labelSelector": {"matchLabels": {"app": name}},
                                    "topologyKey": "kubernetes.io/hostname",
                                }
                            ]
                        }
                    },
                    "containers": [
                        {
                            "name": "main",
                            "image": "app",
                            "resources": {"claims": [{"name": "gpus"}]},
                        }
                    ],
                    "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
                },
            },
        },
    }


@pytest.mark.kube
def test_a_plain_job_with_the_claim_template_mixes_variants(kube_api: httpx.Client) -> None:
    """The problem: 4 pods, one a node, on 2 H100 and 2 A100 nodes, each claim allocated on
    its own node: cu128 on the H100s, cu126 on the A100s."""
    ns = namespace_of(kube_api)
    load(kube_api, cluster(2, 2))
    done = kubeplane.cli("k8s", "claim", "--index", str(PYTORCH), "--count", "1")
    assert done.returncode == 0, done.stderr
    (template,) = yaml.safe_load_all(done.stdout)
    kubeplane.create(kube_api, template, ns)
    kubeplane.create(kube_api, plain_job("plain", template["metadata"]["name"], 4), ns)
    placed = bound(kube_api, "plain", 4)
    by_node = {node: variant_of(claim) for node, claim in placed}
    assert by_node == {"h100-0": "cu128", "h100-1": "cu128", "a100-0": "cu126", "a100-1": "cu126"}


def gang_of(
    tmp_path: Path, objs: list[dict[str, Any]], pods: int, count: int
) -> list[dict[str, Any]]:
    done = kubeplane.cli(
        "k8s", "gang", "--index", str(pinned_index(tmp_path)), "--image", "reg.example/pytorch",
        "--pods", str(pods), "--count", str(count), "--name", "gang",
        "--cluster", str(dump(tmp_path, objs)),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return list(yaml.safe_load_all(done.stdout))


@pytest.mark.kube
def test_the_gang_lands_on_one_kind_of_node_with_one_variant(
    kube_api: httpx.Client, tmp_path: Path
) -> None:
    ns = namespace_of(kube_api)
    objs = cluster(4, 2)
    load(kube_api, objs)
    kubeplane.create_all(kube_api, gang_of(tmp_path, objs, 4, 1), ns)
    placed = bound(kube_api, "gang", 4)
    assert sorted(node for node, _ in placed) == ["h100-0", "h100-1", "h100-2", "h100-3"]
    assert {variant_of(claim) for _, claim in placed} == {"cu128"}
    images = {p["spec"]["containers"][0]["image"] for p in job_pods(kube_api, "gang")}
    assert images == {f"reg.example/pytorch@{DIGEST}"}


def _blocker(node: str) -> list[dict[str, Any]]:
    """A claim for all 8 GPUs of ``node`` and a pod holding it."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "blocker"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "count": 8}}]}},
    }  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "blocker"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {"name": "main", "image": "app", "resources": {"claims": [{"name": "gpus"}]}}
            ],
            "resourceClaims": [{"name": "gpus", "resourceClaimName": "blocker"}],
        },
    }
    return [claim, pod]


@pytest.mark.kube
def test_the_gang_stays_pending_all_together_while_only_3_of_its_nodes_are_free(
    kube_api: httpx.Client, tmp_path: Path
) -> None:
    """Planned on 4 free H100 nodes; one is taken before the gang is created: no pod binds
    (minCount 4), not even on the 3 free H100s nor on the A100s; freed, all 4 bind."""
    ns = namespace_of(kube_api)
    objs = cluster(4, 2)
    load(kube_api, objs)
    gang = gang_of(tmp_path, objs, 4, 8)
    kubeplane.create_all(kube_api, _blocker("h100-3"), ns)
    kubeplane.await_value(
        lambda: kubeplane.get(kube_api, "Pod", "blocker", ns)["spec"].get("nodeName"),
        "the blocker to be bound",
    )
    kubeplane.create_all(kube_api, gang, ns)

    def all_refused() -> bool | None:
        pods = job_pods(kube_api, "gang")
        assert not [p for p in pods if p["spec"].get("nodeName")], "a gang pod was bound"
        refused = [
            p
            for p in pods
            for c in p.get("status", {}).get("conditions") or []
            if c["type"] == "PodScheduled" and c["status"] == "False"
        ]
        return True if len(pods) == 4 and len(refused) == 4 else None

    kubeplane.await_value(all_refused, "the 4 gang pods to be found unschedulable", timeout=90)
    assert not [p for p in job_pods(kube_api, "gang") if p["spec"].get("nodeName")]
    kube_api.delete(f"/api/v1/namespaces/{ns}/pods/blocker", params={"gracePeriodSeconds": "0"})
    placed = bound(kube_api, "gang", 4)
    assert sorted(node for node, _ in placed) == ["h100-0", "h100-1", "h100-2", "h100-3"]
    assert {variant_of(claim) for _, claim in placed} == {"cu128"}


@pytest.mark.kube
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_random_gangs_bind_as_planned_on_the_real_control_plane(
    kube_api: httpx.Client, tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    objs = [o for o in random_cluster(rng) if o["kind"] != "ResourceClaim"]
    pods, count = rng.randint(1, 3), rng.randint(1, 2)
    found = check_gang(objs, pods, count)
    if isinstance(found, Refusal):
        pytest.skip(f"seed {seed}: nothing fits ({found.reasons})")
    ns = namespace_of(kube_api)
    load(kube_api, objs)
    kubeplane.create_all(kube_api, gang_of(tmp_path, objs, pods, count), ns)
    placed = bound(kube_api, "gang", pods)
    assert {variant_of(claim) for _, claim in placed} == {found.label}
    facts = _device_facts(objs)
    products = set()
    for node, claim in placed:
        for result in claim["status"]["allocation"]["devices"]["results"]:
            product, lists = facts[(node, f"{result['pool']}/{result['device']}")]
            assert fits(lists, found.label)
            products.add(product)
    assert len(products) == 1 or found.product is None


@pytest.mark.kube
def test_apply_creates_the_gang_strictly_through_the_kubeconfig(
    kube: Any, kube_api: httpx.Client
) -> None:
    ns = namespace_of(kube_api)
    load(kube_api, cluster(2, 0))
    done = kubeplane.cli(
        "k8s", "gang", "--index", str(PYTORCH), "--image", "reg.example/pytorch", "--pods", "2",
        "--kubeconfig", str(kube.kubeconfig), "--namespace", ns, "--name", "applied", "--apply",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == [
        "ResourceClaimTemplate/applied created", "Workload/applied created",
        "PodGroup/applied created", "Job/applied created",
    ]  # fmt: skip
    placed = bound(kube_api, "applied", 2)
    assert {variant_of(claim) for _, claim in placed} == {"cu128"}


KUBECTL = REPO / ".cache" / "k8s-tools" / "kubectl"


@pytest.mark.kube
def test_the_docs_replan_commands_run_verbatim(kube: Any, kube_api: httpx.Client) -> None:
    """The page's "plan again" block, verbatim, in the kubeconfig's namespace (default):
    the gang is created and bound, deleted by the kubectl line, and created again."""
    if not KUBECTL.is_file():
        pytest.skip("kubectl comes from scripts/k8s-tools (run by scripts/setup)")
    text = DOCS.read_text()
    block = text[text.index("kubectl delete job,podgroup") :].split("```", 1)[0]
    delete, apply = [line for line in block.splitlines() if line.strip()]
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "COLUMNS": "200",
           "PATH": f"{KUBECTL.parent}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip

    def run(line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(shlex.split(line), capture_output=True, text=True, timeout=120,
                              env=env, cwd=REPO)  # fmt: skip

    load(kube_api, cluster(4, 2))
    with kube.client() as client:
        client.headers["X-Test-Namespace"] = "default"
        try:
            done = run(apply)
            assert done.returncode == 0, done.stderr
            placed = bound(client, "pytorch-2-12-0", 4)
            assert {variant_of(claim) for _, claim in placed} == {"cu128"}
            # kubectl waits for the objects to go; the PodGroup goes once its pods are gone,
            # which here (no kubelet, no garbage collector) the test deletes meanwhile
            deleting = subprocess.Popen(shlex.split(delete), env=env, cwd=REPO, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
            try:

                def gone() -> int | None:
                    kubeplane.delete_all(client, "Pod", "default")
                    return deleting.poll()

                assert kubeplane.await_value(gone, "kubectl delete to finish") == 0
            finally:
                deleting.kill()
                deleting.communicate()
            for kind in ("Job", "PodGroup", "Workload", "ResourceClaimTemplate"):
                assert not kubeplane.items(client, kind, "default"), kind
            done = run(apply)
            assert done.returncode == 0, done.stderr
            bound(client, "pytorch-2-12-0", 4)
        finally:
            kubeplane.clear_namespace(client, "default")
