"""Numbers from outside (labels, version files, file names, index documents), read bounded.

Python refuses to turn a string of more than 4,300 digits into an int (and before that limit
the conversion is quadratic), so every number this package reads from untrusted text goes
through here: at most ``MAX_DIGITS`` digits, else one ``InvalidInputError`` line naming the
value and the rule. Version numbers, CUDA and ROCm releases, compute capabilities and
device counts all fit in nine digits many times over.
"""

from __future__ import annotations

import re

from docker_variant.errors import InvalidInputError, one_line

__all__ = [
    "DIGITS",
    "HEADER_NUMBER_CAP",
    "MAX_DIGITS",
    "NaturalKey",
    "header_number",
    "is_number",
    "natural_key",
    "parse_number",
    "parse_version",
]

MAX_DIGITS = 9

# A regular-expression fragment for one bounded decimal number: use it inside patterns so a
# match can never yield a number that ``int`` would choke on.
DIGITS = f"[0-9]{{1,{MAX_DIGITS}}}"

_NUMBER = re.compile(DIGITS)
_VERSION = re.compile(rf"{DIGITS}(?:\.{DIGITS}){{0,7}}")
#: What ``header_number`` reads a larger number as: past every bound this package keeps.
HEADER_NUMBER_CAP = 10**18
# RFC 9110's 1*DIGIT, ASCII only: int() and str.isdigit() also take "²" or Arabic-Indic digits
_HEADER_NUMBER = re.compile(r"[0-9]+")


def is_number(text: str) -> bool:
    """True when ``text`` is a decimal number of at most ``MAX_DIGITS`` digits."""
    return _NUMBER.fullmatch(text) is not None


def parse_number(text: str, what: str) -> int:
    """``text`` as a non-negative int; ``what`` names the value in the error."""
    if _NUMBER.fullmatch(text) is None:
        shown = one_line(text, 60)
        raise InvalidInputError(
            f"{what}: {shown!r} is not a decimal number of 1 to {MAX_DIGITS} digits"
        )
    return int(text)


def parse_version(text: str, what: str) -> tuple[int, ...]:
    """A dotted version (``12.8``, ``6.4.1``) as a tuple of ints, each part bounded."""
    if _VERSION.fullmatch(text) is None:
        shown = one_line(text, 60)
        raise InvalidInputError(
            f"{what}: {shown!r} is not a version of dot-separated decimal numbers "
            f"(at most 8 parts of 1 to {MAX_DIGITS} digits)"
        )
    return tuple(int(part) for part in text.split("."))


def header_number(value: str | None) -> int | None:
    """The number an HTTP header holds (``Content-Length``, ``Retry-After``'s
    delta-seconds: RFC 9110's ``1*DIGIT``, ASCII digits only, spaces around it allowed), or
    ``None`` when it is absent or no such number. A number past ``HEADER_NUMBER_CAP`` reads
    as the cap: it is over every limit anyway, and never converted digit by digit."""
    text = (value or "").strip(" \t")  # OWS: spaces and tabs
    if _HEADER_NUMBER.fullmatch(text) is None:
        return None
    significant = text.lstrip("0")
    if len(significant) > len(str(HEADER_NUMBER_CAP)) - 1:
        return HEADER_NUMBER_CAP
    return int(significant or "0")


NaturalKey = tuple[tuple[int, int, str], ...]
_RUNS = re.compile(r"[0-9]+|[^0-9]+")
# a PCI address (domain:bus:device.function, hex): fixed-width, so its text is its order
_PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


def natural_key(value: str) -> NaturalKey:
    """The one natural order (device ids, agent ids, values without a vendor's rule): numbers
        compared as numbers, ``gpu2`` before ``gpu10``, ``12.8`` before ``12.10``, ``v9`` before
        ``v10``; a text run sorts before a digit run at the same place (``a1`` before ``1a``, so
    newest first a number comes before a name).
        A run of digits compares by its length without leading zeros, then its text, so no run,
        however long, is turned into an int (linear in the text). A PCI address (AMD GPUs',
        descriptor devices') is hex: it orders as its text, ``0000:03:00.0`` before
        ``0000:0c:00.0``."""
    if _PCI_ADDRESS.fullmatch(value):
        return ((0, 0, value.lower()),)
    key = []
    for run in _RUNS.findall(value):
        if run[0].isascii() and run[0].isdigit():
            digits = run.lstrip("0") or "0"
            key.append((1, len(digits), digits))
        else:
            key.append((0, 0, run))
    return tuple(key)
