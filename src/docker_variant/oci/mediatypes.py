"""The media types of manifests and indexes, and the ``Accept`` a manifest fetch sends."""

from __future__ import annotations

__all__ = [
    "DOCKER_MANIFEST",
    "DOCKER_MANIFEST_LIST",
    "GENERIC_TYPES",
    "INDEX_TYPES",
    "MANIFEST_ACCEPT",
    "MANIFEST_TYPES",
    "OCI_INDEX",
    "OCI_MANIFEST",
]

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_MANIFEST_LIST})
MANIFEST_TYPES = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
# Without the OCI index type a registry answers an index tag with 404 MANIFEST_UNKNOWN.
MANIFEST_ACCEPT = ", ".join([OCI_INDEX, OCI_MANIFEST, DOCKER_MANIFEST_LIST, DOCKER_MANIFEST])
#: Content types a registry may label any manifest with; the document says what it is.
GENERIC_TYPES = frozenset({"", "application/json", "application/octet-stream", "text/plain"})
