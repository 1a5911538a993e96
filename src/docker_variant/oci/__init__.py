"""OCI distribution: references, credentials, a registry client and the index scan."""

from docker_variant.oci.auth import Credentials, RegistryAuth, docker_config_path, load_credentials
from docker_variant.oci.client import (
    MANIFEST_ACCEPT,
    Manifest,
    Platform,
    RegistryClient,
    config_labels,
    host_platform,
)
from docker_variant.oci.errors import (
    BadUpstreamResponseError,
    NotFoundError,
    RegistryAuthError,
    RegistryError,
    UpstreamUnavailableError,
)
from docker_variant.oci.reference import Reference, parse_reference, registry_base_url
from docker_variant.oci.scan import scan_index, scan_index_sync
from docker_variant.oci.source import fetch_index, fetch_index_async

__all__ = [
    "MANIFEST_ACCEPT",
    "BadUpstreamResponseError",
    "Credentials",
    "Manifest",
    "NotFoundError",
    "Platform",
    "Reference",
    "RegistryAuth",
    "RegistryAuthError",
    "RegistryClient",
    "RegistryError",
    "UpstreamUnavailableError",
    "config_labels",
    "docker_config_path",
    "fetch_index",
    "fetch_index_async",
    "host_platform",
    "load_credentials",
    "parse_reference",
    "registry_base_url",
    "scan_index",
    "scan_index_sync",
]
