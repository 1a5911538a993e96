"""The global options, and the option types several commands share.

A global option is given before or after the command (``docker-variant --json ls REF`` or
``docker-variant ls REF --json``). To add one: a field of ``Options``, an ``...Opt`` type
below, a parameter of ``app.global_options`` and, for commands that also take it after the
command, a parameter there passed to ``command_options``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from docker_variant.providers import HostReport

__all__ = [
    "DescriptorsOpt",
    "EnableOpt",
    "GpusOpt",
    "HostRootOpt",
    "IndexOpt",
    "JsonOpt",
    "NoVerifyOpt",
    "Options",
    "PlatformOpt",
    "ProvidersFileOpt",
    "command_options",
]


@dataclass
class Options:
    """The global options."""

    json: bool = False
    providers_file: Path | None = None
    enable_provider: list[str] = field(default_factory=list)
    host_root: Path | None = None
    descriptors: Path | None = None

    def host(self, refresh: bool = False) -> HostReport:
        from docker_variant.providers import detect_host

        return detect_host(
            self.providers_file,
            self.enable_provider,
            use_cache=not refresh,
            host_root=self.host_root,
            descriptors=self.descriptors,
        )


JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
ProvidersFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--providers-file",
        envvar="DOCKER_VARIANT_PROVIDERS_FILE",
        help="Supported lists to use instead of detection.",
    ),
]
HostRootOpt = Annotated[
    Path | None,
    typer.Option(
        "--host-root",
        envvar="DOCKER_VARIANT_HOST_ROOT",
        help="Read the host's files (sys/, opt/rocm) under DIR (default /).",
    ),
]
DescriptorsOpt = Annotated[
    Path | None,
    typer.Option(
        "--descriptors",
        envvar="DOCKER_VARIANT_DESCRIPTORS",
        help="Also read device descriptors (*.toml) from DIR.",
    ),
]
GpusOpt = Annotated[
    str | None,
    typer.Option(
        "--gpus",
        help="Choose for exactly these devices, as docker run --gpus: all, N, device=0,2.",
    ),
]
EnableOpt = Annotated[
    list[str] | None,
    typer.Option("--enable-provider", help="Run the third-party provider plugin for namespace NS."),
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


def command_options(
    ctx: typer.Context,
    json_: bool = False,
    providers_file: Path | None = None,
    enable: list[str] | None = None,
    host_root: Path | None = None,
    descriptors: Path | None = None,
) -> Options:
    """The global options given before the command, merged with those given after it."""
    base: Options = ctx.obj if isinstance(ctx.obj, Options) else Options()
    return Options(
        json=json_ or base.json,
        providers_file=providers_file or base.providers_file,
        enable_provider=[*base.enable_provider, *(enable or [])],
        host_root=host_root or base.host_root,
        descriptors=descriptors or base.descriptors,
    )
