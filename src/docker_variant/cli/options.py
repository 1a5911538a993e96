"""The global options, and the option types several commands share.

A global option is given before or after the command (``docker-variant --json ls REF`` or
``docker-variant ls REF --json``): declared once, by ``app.global_options``, and every command
takes it too (``app`` adds those options to each command, and ``after_command`` merges what
was given after the command's name). A command reads them as ``options_of(ctx)``. To add
one: a field of ``Options``, an ``...Opt`` type below, a parameter of ``app.global_options``
named in ``GLOBAL_OPTIONS``, and its merge in ``after_command``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer

if TYPE_CHECKING:
    from docker_variant.providers import HostReport

__all__ = [
    "GLOBAL_OPTIONS",
    "CaFileOpt",
    "ClientCertOpt",
    "ClientKeyOpt",
    "DescriptorsOpt",
    "EnableOpt",
    "GpusOpt",
    "HostRootOpt",
    "IndexOpt",
    "JsonFormatOpt",
    "JsonOpt",
    "NoVerifyOpt",
    "Options",
    "PlatformOpt",
    "ProvidersFileOpt",
    "after_command",
    "options_of",
]


@dataclass
class Options:
    """The global options."""

    json: bool = False
    providers_file: Path | None = None
    enable_provider: list[str] = field(default_factory=list)
    host_root: Path | None = None
    descriptors: Path | None = None
    json_lines: bool = False  # --format '{{json .}}': the JSON on one line (implies json)
    # what registries and --index URLs are trusted with besides the system's CAs and
    # certs.d, and the client certificate presented when one asks (mutual TLS)
    ca_file: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None

    def use_tls(self) -> None:
        """Make ``--ca-file``/``--client-cert``/``--client-key`` every client's (checked
        now: exit 2 naming the file)."""
        given = (self.ca_file, self.client_cert, self.client_key)
        # the HTTP stack (httpx) is loaded only by commands that need it
        if any(given) or "docker_variant.oci.http" in sys.modules:
            from docker_variant.oci.http import TLSFiles, use_tls

            ca, cert, key = (None if p is None else str(p) for p in given)
            use_tls(TLSFiles(() if ca is None else (ca,), cert, key))

    def host(self, refresh: bool = False) -> HostReport:
        from docker_variant.providers import detect_host

        return detect_host(
            self.providers_file,
            self.enable_provider,
            use_cache=not refresh,
            host_root=self.host_root,
            descriptors=self.descriptors,
        )


#: The help panel of the global options, in the group's help and in each command's.
GLOBAL_PANEL = "Global options"

JsonOpt = Annotated[
    bool, typer.Option("--json", help="Machine-readable output.", rich_help_panel=GLOBAL_PANEL)
]
#: What ``--format`` takes on every command: Docker's ``{{json .}}`` (spaces inside the braces
#: free) or ``json``. ``ls`` has its own ``--format``, which takes templates too.
_JSON_FORMAT = re.compile(r"json|\{\{ *json +\. *\}\}")


def _json_format(value: str | None) -> str | None:
    if value is not None and not _JSON_FORMAT.fullmatch(value):
        raise click.BadParameter(
            f"{value!r}: this command's --format takes json or '{{{{json .}}}}' (the --json "
            "output on one line; ls also takes a template)"
        )
    return value


JsonFormatOpt = Annotated[
    str | None,
    typer.Option(
        "--format",
        callback=_json_format,
        rich_help_panel=GLOBAL_PANEL,
        help="json or '{{json .}}', as docker takes it: the --json output, on one line.",
    ),
]
ProvidersFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--providers-file",
        envvar="DOCKER_VARIANT_PROVIDERS_FILE",
        rich_help_panel=GLOBAL_PANEL,
        help="Supported lists to use instead of detection.",
    ),
]
HostRootOpt = Annotated[
    Path | None,
    typer.Option(
        "--host-root",
        envvar="DOCKER_VARIANT_HOST_ROOT",
        rich_help_panel=GLOBAL_PANEL,
        help="Read the host's files (sys/, opt/rocm) under DIR (default /).",
    ),
]
DescriptorsOpt = Annotated[
    Path | None,
    typer.Option(
        "--descriptors",
        envvar="DOCKER_VARIANT_DESCRIPTORS",
        rich_help_panel=GLOBAL_PANEL,
        help="Also read device descriptors (*.toml) from DIR.",
    ),
]
CaFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--ca-file",
        rich_help_panel=GLOBAL_PANEL,
        help="Also trust the CAs in FILE (PEM) for registries and --index URLs.",
    ),
]
ClientCertOpt = Annotated[
    Path | None,
    typer.Option(
        "--client-cert",
        rich_help_panel=GLOBAL_PANEL,
        help="Present this certificate (PEM) to a registry that asks for one.",
    ),
]
ClientKeyOpt = Annotated[
    Path | None,
    typer.Option(
        "--client-key",
        rich_help_panel=GLOBAL_PANEL,
        help="The --client-cert's private key (PEM; default: in the certificate's file).",
    ),
]
GpusOpt = Annotated[
    str | None,
    typer.Option(
        "--gpus",
        help="Choose for the GPUs a container gets, as docker run --gpus: all (default), "
        "N, device=0,2 or device=GPU-UUID; a variant must run on each of them.",
    ),
]
EnableOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--enable-provider",
        help="Run the third-party provider plugin for namespace NS.",
        rich_help_panel=GLOBAL_PANEL,
    ),
]
PlatformOpt = Annotated[
    str | None,
    typer.Option(
        "--platform",
        envvar="DOCKER_DEFAULT_PLATFORM",
        help="os/arch[/variant] to choose for, as docker pull (default: this machine's).",
    ),
]
IndexOpt = Annotated[
    str | None,
    typer.Option("--index", help="A variant index document (file or URL) instead of REF."),
]
NoVerifyOpt = Annotated[
    bool,
    typer.Option("--no-verify", help="Do not check the labels against the image's binaries."),
]


#: ``app.global_options``'s parameters, which every command also takes after its name.
GLOBAL_OPTIONS = (
    "json_",
    "providers_file",
    "enable",
    "host_root",
    "descriptors",
    "json_format",
    "ca_file",
    "client_cert",
    "client_key",
)


def _path(value: Any) -> Path | None:
    return None if value is None else Path(value)


def after_command(base: Options, given: Mapping[str, Any]) -> Options:
    """``base`` (the options given before the command) with those ``given`` after it, by
    parameter name: a value given after the command wins, ``--enable-provider`` adds."""
    json_lines = base.json_lines or given.get("json_format") is not None
    return Options(
        json=base.json or bool(given.get("json_")) or json_lines,
        providers_file=_path(given.get("providers_file")) or base.providers_file,
        enable_provider=[*base.enable_provider, *(given.get("enable") or [])],
        host_root=_path(given.get("host_root")) or base.host_root,
        descriptors=_path(given.get("descriptors")) or base.descriptors,
        json_lines=json_lines,
        ca_file=_path(given.get("ca_file")) or base.ca_file,
        client_cert=_path(given.get("client_cert")) or base.client_cert,
        client_key=_path(given.get("client_key")) or base.client_key,
    )


def options_of(ctx: click.Context) -> Options:
    """The global options of the command running in ``ctx``."""
    return ctx.obj if isinstance(ctx.obj, Options) else Options()
