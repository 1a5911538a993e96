"""The variant extension's names on the wire, in one place: the registry extension that
``variant-proxy`` serves and that clients, ``k8s containerd-hosts`` and the nginx front
(``deploy/nginx/``) speak."""

from __future__ import annotations

__all__ = ["DEVICES_HEADER", "EXTENSION", "LABEL_HEADER", "PROPERTIES_HEADER", "variants_path"]

#: The extension's name in ``/v2/_oci/ext/discover`` and its path segment.
EXTENSION = "_variants"
#: The header a client sends with its host's supported lists (compact JSON).
PROPERTIES_HEADER = "X-Variant-Properties"
#: With it, on a host whose devices differ: a compact JSON array of each different device's
#: lists (accelerator namespaces); the variant chosen must fit every one of them.
DEVICES_HEADER = "X-Variant-Devices"
#: The header naming the variant a resolved manifest answer is.
LABEL_HEADER = "X-Variant-Label"


def variants_path(repository: str, version: str) -> str:
    """``/v2/<repository>/_variants/<version>``: a version's variant index document."""
    return f"/v2/{repository}/{EXTENSION}/{version}"
