"""The typer application: its global options, its commands and ``main``.

Exit codes: 0 done; 1 no compatible variant; 2 bad input; 3 registry or engine unreachable,
or what was asked for not found or refused; 4 internal error. An error is one line on stderr,
``docker-variant: error: ...`` (then a ``hint: ...`` line where there is one), never a
traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Annotated, Any

import click
import typer
from click.core import ParameterSource
from typer.core import TyperGroup

from docker_variant.cli import k8s, plugin, providers, publish, select
from docker_variant.cli.options import (
    GLOBAL_OPTIONS,
    CaFileOpt,
    ClientCertOpt,
    ClientKeyOpt,
    DescriptorsOpt,
    EnableOpt,
    HostRootOpt,
    JsonFormatOpt,
    JsonOpt,
    Options,
    ProvidersFileOpt,
    after_command,
    options_of,
)
from docker_variant.cli.output import broken_pipe, error, json_on_one_line, warn
from docker_variant.errors import DockerVariantError, MissingError, UnauthorizedError
from docker_variant.oci.credcache import credentials_once
from docker_variant.pluginmeta import COMPLETION_COMMANDS, VERSION_LINE

__all__ = ["app", "main"]


def help_(
    ctx: typer.Context,
    command: Annotated[
        list[str] | None, typer.Argument(help="The command, e.g. pull or k8s claim.")
    ] = None,
) -> None:
    """Show the help of docker-variant, or of COMMAND (as COMMAND --help)."""
    root = ctx.find_root()
    root.command.main([*(command or []), "--help"], prog_name=root.info_name, standalone_mode=False)


#: ``-h`` as well as ``--help``, as docker, uv and pip take it; sub-commands inherit it.
HELP_SETTINGS = {"help_option_names": ["-h", "--help"]}

#: The commands, in the order help lists them (then ``k8s``).
COMMANDS: dict[str, Callable[..., None]] = {
    "providers": providers.providers,
    "ls": select.ls_,
    "resolve": select.resolve,
    "pull": select.pull,
    "labels": publish.labels,
    "inspect": publish.inspect_,
    "push": publish.push,
    "publish": publish.publish,
    "build": publish.build,
    "install-plugin": plugin.install_plugin,
    "help": help_,
}


def _taking_global_options(callback: Callable[..., Any]) -> Callable[..., Any]:
    """``callback`` (a command's), which first takes the global options given after the
    command's name out of its arguments and into the context's ``Options``."""

    def run(**kwargs: Any) -> Any:
        ctx = click.get_current_context()
        given = {
            name: kwargs.pop(name)
            for name in GLOBAL_OPTIONS
            # an environment variable was read for the group already, a default is no news
            if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
        }
        for name in GLOBAL_OPTIONS:
            kwargs.pop(name, None)
        ctx.obj = after_command(options_of(ctx), given)
        ctx.obj.use_tls()
        json_on_one_line(ctx.obj.json_lines)
        try:
            with credentials_once():  # each registry's credential helper runs once
                return callback(**kwargs)
        except BrokenPipeError:  # before click, which would make it exit 1
            broken_pipe()

    return run


class _Commands(TyperGroup):
    """The top-level group, whose ``COMMANDS`` become click commands when they are first
    asked for: typer would otherwise build every command's options (signatures and
    annotations read, types converted) on each run, which needs only one.

    Every command (``k8s``'s too) also takes the group's global options, the same click
    parameters: so they work after the command as before it, are listed in its help, and
    its option values are parsed as click parses them (a value that looks like an option
    or a command stays a value)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in self.commands.values():  # the sub-apps, which typer built already
            self._add_global_options(command)

    def _add_global_options(self, command: click.Command) -> None:
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                self._add_global_options(sub)
            return
        assert command.callback is not None
        # a command's own option of the same name wins (ls's --format takes templates too)
        own = {opt for param in command.params for opt in param.opts}
        command.params.extend(
            p for p in self.params if p.name in GLOBAL_OPTIONS and not own.intersection(p.opts)
        )
        command.callback = _taking_global_options(command.callback)

    def list_commands(self, ctx: click.Context) -> list[str]:
        # a command of COMMANDS is added once made: ``help``'s listing would name it twice
        return [*COMMANDS, *(name for name in super().list_commands(ctx) if name not in COMMANDS)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in COMMANDS:
            alone = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
            alone.command(cmd_name)(COMMANDS[cmd_name])
            command = typer.main.get_command(alone)
            self._add_global_options(command)
            self.add_command(command, cmd_name)
        return command


app = typer.Typer(
    name="docker-variant",
    help="PEP 817/825 variants for container images.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion, --show-completion (bash, zsh, fish)
    cls=_Commands,
    context_settings=HELP_SETTINGS,
)


def _print_version(wanted: bool) -> None:
    if wanted:
        sys.stdout.write(VERSION_LINE)
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
    json_format: JsonFormatOpt = None,
    providers_file: ProvidersFileOpt = None,
    enable: EnableOpt = None,
    host_root: HostRootOpt = None,
    descriptors: DescriptorsOpt = None,
    ca_file: CaFileOpt = None,
    client_cert: ClientCertOpt = None,
    client_key: ClientKeyOpt = None,
    _version: VersionOpt = False,
) -> None:
    """The global options (see ``cli.options``), before the command; ``_Commands`` gives
    each command these parameters too, for after it."""
    lines = json_format is not None
    ctx.obj = Options(
        json_ or lines,
        providers_file,
        list(enable or []),
        host_root,
        descriptors,
        lines,
        ca_file,
        client_cert,
        client_key,
    )


app.add_typer(k8s.k8s_app, name="k8s")


#: What click 8.2 and later raise for a command given no arguments (``no_args_is_help``);
#: click 8.1 prints the help and exits 2 itself (its UsageError path), so nothing to catch.
_NO_ARGS_IS_HELP: tuple[type[click.exceptions.ClickException], ...] = tuple(
    found
    for found in (getattr(click.exceptions, "NoArgsIsHelpError", None),)
    if isinstance(found, type) and issubclass(found, click.exceptions.ClickException)
)


def main(argv: list[str] | None = None) -> None:
    """Run the command line (``argv``: the arguments, default ``sys.argv[1:]``) and exit."""
    args = list(sys.argv[1:] if argv is None else argv)
    prog = "docker-variant"
    if args[:1] and args[0] in COMPLETION_COMMANDS:  # Docker completing ``docker variant``
        from docker_variant.cli.complete import run_cobra_completion

        sys.exit(run_cobra_completion(typer.main.get_command(app), args))
    if (as_plugin := plugin.plugin_args(args)) is not None:  # run by the Docker CLI
        args, env = as_plugin
        os.environ.update(env)
        prog = _plugin_prog(args)
    try:
        code = app(args=args, prog_name=prog, standalone_mode=False)
    except BrokenPipeError:
        broken_pipe()
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        error("interrupted")
        sys.exit(130)
    except _NO_ARGS_IS_HELP as exc:  # the bare command: its help
        exc.show()
        sys.exit(2)
    except click.exceptions.ClickException as exc:  # usage errors: bad option, unknown command
        error(*_usage_error(exc))
        sys.exit(2)
    except DockerVariantError as exc:
        error(_error_message(exc), exc.hint)
        sys.exit(exc.exit_code)
    except Exception as exc:  # a bug: still one line, never a traceback
        error(f"internal error: {type(exc).__name__}: {exc}")
        sys.exit(4)
    sys.exit(code if isinstance(code, int) else 0)


#: typer's options that write a completion script for the program's name.
_COMPLETION_SCRIPT_OPTIONS = ("--install-completion", "--show-completion")


def _plugin_prog(args: list[str]) -> str:
    """The program's name as Docker runs the plugin: ``docker variant``, but for typer's
    completion scripts, which are ``docker-variant``'s. Written for ``docker variant``, a
    script would name the command ``docker variant`` (``complete ... docker variant``,
    ``_DOCKER VARIANT_COMPLETE``) and break Docker's own completion in every new shell;
    ``docker variant <TAB>`` goes through Docker's completion, which asks ``__complete``."""
    if not any(arg.startswith(_COMPLETION_SCRIPT_OPTIONS) for arg in args):
        return "docker variant"
    warn(
        "the completion script is docker-variant's; `docker variant <TAB>` completes "
        "through Docker's own completion, which asks docker-variant (nothing to install)"
    )
    return "docker-variant"


def _error_message(exc: DockerVariantError) -> str:
    """``exc``'s message, said to be "not found" or "unauthorized" where it is: a registry
    that cannot be reached, an unknown tag and refused credentials all exit 3, and the
    message tells them apart."""
    if isinstance(exc, MissingError):
        return f"not found: {exc}"
    if isinstance(exc, UnauthorizedError):
        return f"unauthorized: {exc}"
    return str(exc)


def _usage_error(exc: click.exceptions.ClickException) -> tuple[str, str | None]:
    """Click's usage error as the message and hint of ``output.error`` (click's own shows
    the usage line, then ``Error: ...``)."""
    ctx = exc.ctx if isinstance(exc, click.exceptions.UsageError) else None
    hint = f"see '{ctx.command_path} --help'" if ctx is not None else None
    return exc.format_message(), hint
