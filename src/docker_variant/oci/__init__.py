"""OCI distribution: the wire grammar, error codes, HTTP clients, credentials, a registry
client and the index scan.

Nothing is imported until it is asked for (PEP 562): ``oci.grammar``, ``oci.reference``,
``oci.errcode`` and ``oci.mediatypes`` are pure and load no httpx, so the variant model and
the command line's parsing can use them without the cost of the client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from docker_variant.lazy import lazy_attributes

if TYPE_CHECKING:
    from docker_variant.oci.auth import (
        Credentials,
        RegistryAuth,
        docker_config_path,
        load_credentials,
    )
    from docker_variant.oci.client import Manifest, RegistryClient, config_labels
    from docker_variant.oci.errors import (
        BadUpstreamResponseError,
        NotFoundError,
        RegistryAuthError,
        RegistryError,
        UpstreamUnavailableError,
    )
    from docker_variant.oci.mediatypes import MANIFEST_ACCEPT
    from docker_variant.oci.reference import Reference, parse_reference, registry_base_url
    from docker_variant.oci.scan import scan_index, scan_index_sync
    from docker_variant.oci.source import fetch_index, fetch_index_async
    from docker_variant.variant.platform import Platform, host_platform

# Each public name and the module that defines it.
_HOMES = {
    "MANIFEST_ACCEPT": "mediatypes",
    "BadUpstreamResponseError": "errors",
    "Credentials": "auth",
    "Manifest": "client",
    "NotFoundError": "errors",
    "Platform": "client",
    "Reference": "reference",
    "RegistryAuth": "auth",
    "RegistryAuthError": "errors",
    "RegistryClient": "client",
    "RegistryError": "errors",
    "UpstreamUnavailableError": "errors",
    "config_labels": "client",
    "docker_config_path": "auth",
    "fetch_index": "source",
    "fetch_index_async": "source",
    "host_platform": "client",
    "load_credentials": "auth",
    "parse_reference": "reference",
    "registry_base_url": "reference",
    "scan_index": "scan",
    "scan_index_sync": "scan",
}

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


__getattr__ = lazy_attributes(__name__, _HOMES)
