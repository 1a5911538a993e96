"""The typer application: its global options, its commands and ``main``.

Exit codes: 0 done; 1 no compatible variant; 2 bad input; 3 registry or engine unreachable;
4 internal error. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import sys
from typing import Annotated

import click
import typer

from docker_variant import __version__
from docker_variant.cli import k8s, plugin, providers, publish, select
from docker_variant.cli.options import (
    DescriptorsOpt,
    EnableOpt,
    HostRootOpt,
    JsonOpt,
    Options,
    ProvidersFileOpt,
)
from docker_variant.errors import DockerVariantError
from docker_variant.safetext import safe_text

__all__ = ["app", "main"]

app = typer.Typer(
    name="docker-variant",
    help="PEP 817/825 variants for container images.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _print_version(wanted: bool) -> None:
    if wanted:
        sys.stdout.write(f"docker-variant {__version__}\n")
        raise typer.Exit()


VersionOpt = Annotated[
    bool,
    typer.Option(
        "--version",
        is_eager=True,
        expose_value=False,
        callback=_print_version,
        help="Print the version and exit.",
    ),
]


@app.callback()
def global_options(
    ctx: typer.Context,
    json_: JsonOpt = False,
    providers_file: ProvidersFileOpt = None,
    enable: EnableOpt = None,
    host_root: HostRootOpt = None,
    descriptors: DescriptorsOpt = None,
    _version: VersionOpt = False,
) -> None:
    """The global options (see ``cli.options``), before the command."""
    ctx.obj = Options(json_, providers_file, list(enable or []), host_root, descriptors)


app.command()(providers.providers)
app.command("ls")(select.ls_)
app.command()(select.resolve)
app.command()(select.pull)
app.command()(publish.labels)
app.command("inspect")(publish.inspect_)
app.command()(publish.push)
app.command()(publish.publish)
app.command()(publish.build)
app.command("install-plugin")(plugin.install_plugin)
app.add_typer(k8s.k8s_app, name="k8s")


def main(argv: list[str] | None = None) -> None:
    """Run the command line (``argv``: the arguments, default ``sys.argv[1:]``) and exit."""
    args = list(sys.argv[1:] if argv is None else argv)
    prog = "docker-variant"
    if args[:1] == ["variant"]:  # run by the Docker CLI as a plugin
        args, prog = args[1:], "docker variant"
    try:
        code = app(args=args, prog_name=prog, standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.stderr.write("docker-variant: interrupted\n")
        sys.exit(130)
    except click.exceptions.ClickException as exc:  # usage errors: bad option, unknown command
        exc.show()
        sys.exit(2)
    except DockerVariantError as exc:
        # a value quoted in a message may hold a newline (a fuzzed index key did) or a
        # terminal escape: shown as escapes, the message stays one line and harmless
        sys.stderr.write(f"docker-variant: {safe_text(exc, markup=False)}\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("docker-variant: interrupted\n")
        sys.exit(130)
    except Exception as exc:  # a bug: still one line, never a traceback
        message = safe_text(exc, markup=False)
        sys.stderr.write(f"docker-variant: internal error: {type(exc).__name__}: {message}\n")
        sys.exit(4)
    sys.exit(code if isinstance(code, int) else 0)
