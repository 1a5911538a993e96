"""A build context as the tar archive the Engine API's ``/build`` takes.

``.dockerignore`` is read as Docker reads it: each pattern is matched against a path
relative to the context root (a leading ``/`` changes nothing), segment by segment as Go's
``filepath.Match`` does (``*`` and ``?`` never cross a ``/``), with ``**`` for any number
of directories; a pattern that matches a directory leaves out what is under it; the last
pattern that matches decides, and ``!pattern`` takes a path back. So ``*.log`` leaves out
``a.log`` but not ``logs/b.log`` (``**/*.log`` does). The Dockerfile and ``.dockerignore``
are always sent, as Docker sends them.
"""

from __future__ import annotations

import io
import posixpath
import re
import tarfile
from pathlib import Path

from docker_variant.errors import InvalidInputError

__all__ = ["context_archive"]

_IGNORE_FILE = ".dockerignore"


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """One ``.dockerignore`` pattern (cleaned) as a regular expression over whole paths."""
    out, at = [], 0
    while at < len(pattern):
        char = pattern[at]
        if pattern.startswith("**", at):
            at += 2
            if pattern.startswith("/", at):  # "**/": no directory, or any number of them
                out.append("(?:.*/)?")
                at += 1
            else:
                out.append(".*")
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "\\" and at + 1 < len(pattern):
            at += 1
            out.append(re.escape(pattern[at]))
        elif char == "[" and (close := pattern.find("]", at + 1)) > at + 1:
            body = pattern[at + 1 : close]
            negated = body.startswith("^")
            body = body[1:] if negated else body
            out.append("[" + ("^" if negated else "") + body.replace("\\", "\\\\") + "]")
            at = close
        else:
            out.append(re.escape(char))
        at += 1
    return re.compile("".join(out))


def _ignore_rules(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """The rules of a ``.dockerignore``'s ``text``: (takes back, pattern), in order."""
    rules: list[tuple[bool, re.Pattern[str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = posixpath.normpath(line[1:].strip() if keep else line).lstrip("/")
        if pattern in ("", "."):
            continue
        rules.append((keep, _pattern_regex(pattern)))
    return rules


def _ignored(relative: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the last rule matching ``relative``, or one of its parent directories, leaves
    it out."""
    parts = relative.split("/")
    paths = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for keep, regex in rules:
        if any(regex.fullmatch(path) for path in paths):
            ignored = not keep
    return ignored


def context_archive(root: Path, dockerfile: str) -> bytes:
    """The context under ``root`` as an uncompressed tar; ``dockerfile`` must be in it."""
    if not root.is_dir():
        raise InvalidInputError(f"build context {str(root)!r} is not a directory")
    target = (root / dockerfile).resolve()
    if not target.is_relative_to(root.resolve()):
        raise InvalidInputError(
            f"build context {str(root)!r}: dockerfile {dockerfile!r} leads outside it "
            f"(to {str(target)!r}); the engine sees only the context"
        )
    if not target.is_file():
        raise InvalidInputError(
            f"build context {str(root)!r} has no {dockerfile!r} (the matrix's dockerfile)"
        )
    ignore = root / _IGNORE_FILE
    text = ignore.read_text(encoding="utf-8", errors="replace") if ignore.is_file() else ""
    rules = _ignore_rules(text)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in sorted(root.rglob("*")):
            relative = path.relative_to(root).as_posix()
            if relative not in (dockerfile, _IGNORE_FILE) and _ignored(relative, rules):
                continue
            archive.add(path, arcname=relative, recursive=False)
    return buffer.getvalue()
