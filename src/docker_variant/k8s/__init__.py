"""Kubernetes (docs/reference/kubernetes.md): a DRA ResourceClaimTemplate from an image's variants
(``claim.py``, CEL selectors in ``cel.py``), node labels from a host's supported lists
(``labels.py``) and a containerd ``hosts.toml`` that sends them to variant-proxy
(``containerd.py``). Manifests are written as YAML by ``yamltext.py``."""

from docker_variant.k8s.claim import (
    DEFAULT_DEVICE_CLASS,
    ClaimPlan,
    Subrequest,
    claim_template,
    plan_claim,
)
from docker_variant.k8s.labels import LABEL_PREFIX, NodeLabels, node_labels
from docker_variant.k8s.yamltext import dump_yaml

__all__ = [
    "DEFAULT_DEVICE_CLASS",
    "LABEL_PREFIX",
    "ClaimPlan",
    "NodeLabels",
    "Subrequest",
    "claim_template",
    "dump_yaml",
    "node_labels",
    "plan_claim",
]
