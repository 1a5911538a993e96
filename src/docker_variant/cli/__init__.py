"""The ``docker-variant`` command line, also run by Docker as ``docker variant``.

- ``app``: the typer application, its global options and ``main`` (exit codes, one-line
  errors);
- ``options``: the global options and the option types commands share;
- ``output``: the consoles, JSON output and warnings;
- ``select``: ``ls``, ``resolve`` and ``pull`` (which index, which variant);
- ``publish``: ``labels``, ``inspect``, ``push``, ``publish`` and ``build``;
- ``k8s``: the ``k8s`` sub-commands;
- ``providers``: ``providers``;
- ``plugin``: ``install-plugin``.

Each command imports what only it uses, in its body: a ``docker variant`` call starts this
process twice, and ``resolve --index`` should cost little more than variantlib's own import
(tests/test_cli_cost.py checks which modules a command loads).
"""

from __future__ import annotations

from docker_variant.cli.app import app, main

__all__ = ["app", "main"]
