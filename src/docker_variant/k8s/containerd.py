"""A containerd ``hosts.toml`` that sends this node's ``X-Variant-Properties`` (docs/reference/proxy-api.md and kubernetes.md).

With it under containerd's hosts directory (``config_path`` of the CRI plugin, or
``ctr images pull --hosts-dir``), every pull from ``REGISTRY`` goes to ``server`` (a
variant-proxy) with the node's supported lists in a header, and the proxy answers the
manifest of the variant that fits the node: unmodified kubelets pull the right variant.
containerd sends the header on its first request, a ``HEAD`` of the tag, so the choice is
made there.

On a node whose devices differ (an H200 and an L4), the header lists only what every device
runs (``providers.gpus.node_header``), and ``X-Variant-Devices`` adds each different
device's lists, so that the proxy chooses a variant each device runs (cu126, whose code is
for both, though their ``sm_arch`` lists share no value); a proxy that ignores the second
header still never chooses a variant some device cannot run.

The header value is compact JSON in a TOML literal string (``'...'``: no escapes to read);
should the JSON ever contain a ``'`` (our value grammar has none), a basic string is written.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from docker_variant.errors import InvalidInputError
from docker_variant.oci.extension import DEVICES_HEADER, PROPERTIES_HEADER
from docker_variant.oci.reference import check_registry, registry_base_url
from docker_variant.variant import SupportedLists

__all__ = [
    "CA_FILE",
    "CLIENT_CERT_FILE",
    "CLIENT_KEY_FILE",
    "DEVICES",
    "HEADER",
    "HEADER_WARN_BYTES",
    "check_registry",
    "check_server",
    "default_server",
    "header_value",
    "hosts_toml",
    "write_host_file",
    "write_hosts_toml",
]

HEADER = PROPERTIES_HEADER
DEVICES = DEVICES_HEADER
#: Above this a header line may be refused by proxies on the way (nginx's default buffer).
HEADER_WARN_BYTES = 8 * 1024
CAPABILITIES = ("pull", "resolve")


def default_server(registry: str) -> str:
    """``http://`` for loopback registries, ``https://`` otherwise (as the CLI connects)."""
    return registry_base_url(registry)


def check_server(url: str) -> str:
    parts = urlsplit(url)
    if (
        parts.scheme not in ("http", "https")
        or not parts.netloc
        or parts.query
        or parts.fragment
        or any(c.isspace() or c in "\"'\\" or ord(c) < 0x20 for c in url)
    ):
        raise InvalidInputError(
            f"server {url!r} is not an http:// or https:// URL (host[:port][/path], "
            "no quotes, spaces, query or fragment)"
        )
    return url.rstrip("/")


def _toml_string(text: str) -> str:
    if "'" not in text and not any(ord(c) < 0x20 or c == "\x7f" for c in text):
        return f"'{text}'"
    return json.dumps(text)  # JSON string escapes are TOML basic-string escapes (ASCII out)


def header_value(host: SupportedLists | Sequence[SupportedLists]) -> str:
    """The lists (or a list of them) as compact JSON, in their own order (feature order is a
    preference)."""
    return json.dumps(host, separators=(",", ":"))


def hosts_toml(
    registry: str,
    server: str,
    host: SupportedLists,
    devices: Sequence[SupportedLists] = (),
    *,
    ca: str | None = None,
    client: tuple[str, str | None] | None = None,
) -> str:
    """The ``hosts.toml`` for ``registry``: pulls go to ``server`` with the node's lists
    (``providers.gpus.node_header``: what every device runs, and each different device's
    lists where they differ); containerd trusts ``ca`` for it (a PEM bundle) and presents
    ``client`` = (certificate, key: None when in the certificate's file) if it asks."""
    check_registry(registry)
    server = check_server(server)
    properties = header_value(host)
    quoted = json.dumps(server)
    more = f"    {DEVICES} = {_toml_string(header_value(list(devices)))}\n" if devices else ""
    return (
        f"# containerd hosts.toml for {registry}, from docker-variant k8s containerd-hosts.\n"
        f"# Pulls go to {server} with this node's supported lists; a variant-proxy there\n"
        "# answers a tag with the manifest of the variant that fits them.\n"
        f"server = {quoted}\n"
        "\n"
        f"[host.{quoted}]\n"
        f"  capabilities = {json.dumps(list(CAPABILITIES))}\n"
        f"{_tls_lines(ca, client)}"
        f"  [host.{quoted}.header]\n"
        f"    {HEADER} = {_toml_string(properties)}\n"
        f"{more}"
    )


def _tls_lines(ca: str | None, client: tuple[str, str | None] | None) -> str:
    """containerd's ``ca`` and ``client`` keys of a host, the paths as given: containerd reads
    a relative one in the registry's own directory beside ``hosts.toml``."""
    lines = f"  ca = {json.dumps(ca)}\n" if ca is not None else ""
    if client is not None:
        cert, key = client
        pair = [p for p in (cert, key) if p is not None]
        lines += f"  client = {json.dumps([pair] if len(pair) == 2 else pair[0])}\n"
    return lines


#: The names the agent gives the TLS files it keeps beside each ``hosts.toml`` (Docker's
#: certs.d names, which containerd also reads where a directory has no hosts.toml).
CA_FILE, CLIENT_CERT_FILE, CLIENT_KEY_FILE = "ca.crt", "client.cert", "client.key"


def write_hosts_toml(directory: Path, registry: str, text: str) -> Path:
    """Write ``directory/<registry>/hosts.toml`` atomically (a reader never sees half a file)."""
    return write_host_file(directory, registry, "hosts.toml", text.encode(), 0o644)


def write_host_file(directory: Path, registry: str, name: str, data: bytes, mode: int) -> Path:
    """Write ``directory/<registry>/<name>`` atomically with ``mode``; ``InvalidInputError``
    naming the file when it cannot be written."""
    check_registry(registry)
    target_dir = directory / registry
    target = target_dir / name
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=target_dir)
        try:
            os.fchmod(fd, mode)  # before a byte is written: a key is never readable by others
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise InvalidInputError(f"cannot write {target}: {exc.strerror or exc}") from exc
    return target
