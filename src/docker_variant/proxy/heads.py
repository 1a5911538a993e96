"""The plainest heads, taken by one regular expression each instead of a parser.

Most manifest GETs come as one segment: a whole request head, kept alive, without a body.
uvicorn's parser callbacks and the request cycle around them (a Python call per header, a
scope built field by field) were a large part of the proxy's own time for them, so a head
that fits the strict grammar below is split here instead; any other (HTTP/1.0, a bare CR or
LF, a control byte, obsolete line folding, a body, an upgrade, an expectation, a head in
pieces or with the next request behind it...) returns ``None`` and goes to uvicorn's parser
as before. The grammar is RFC 9112's, narrowed: nothing is taken here that httptools would
refuse or frame differently.

Most answers are as plain: whole in one segment, one ``Content-Length``, a ``Date``, nothing
a proxy drops or rewrites. ``PlainAnswers`` recognises them, and the proxy sends them on as
they came, bytes for bytes; any other answer goes to the parser and the header rules.

The expressions have no ambiguous repetition (a header line is a token, a colon, value bytes
that are never CR or LF, and CRLF), so a match costs time linear in the head's size.

Both readers also exist in C (``_heads.c``, built with the package where a C compiler is),
because they are on every plain read's path (what that saves: ``bench/README.md``). The
expressions here are the reference: they serve where the C module was not built (``NATIVE``
says which), and the tests hold the C readers to them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import ModuleType

__all__ = ["HEAD_LIMIT", "LENGTH_DIGITS", "NATIVE", "PlainAnswers", "split_request"]

_native: ModuleType | None
try:
    from docker_variant.proxy import _heads as _native
except ImportError:  # installed without a C compiler: the expressions serve
    _native = None
NATIVE = _native is not None  # the C readers serve

HEAD_LIMIT = 16 << 10  # longer heads go to the parser
# a Content-Length of more digits is no length here (int() refuses over 4,300 digits, and
# llhttp any length past 2**64)
LENGTH_DIGITS = 18

# a GET or HEAD of an origin-form target (no '#'), then header lines of an RFC 9110 token,
# a colon and a value of VCHAR, SP, HTAB and obs-text, then the blank line, then nothing
_TOKEN = rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_VALUE = rb"[\t\x20-\x7e\x80-\xff]*"
_FIELDS = rb"((?:" + _TOKEN + b":" + _VALUE + rb"\r\n)*)\r\n"
_REQUEST = re.compile(rb"(GET|HEAD) (/[!-\x22\x24-\x7e]*) HTTP/1\.1\r\n" + _FIELDS)
# an HTTP/1.1 status line of a final status (2xx to 5xx)
_STATUS_LINE = rb"HTTP/1\.1 ([2-5][0-9][0-9]) " + _VALUE + rb"\r\n"
# request headers that make a request other than the plainest: a body, an upgrade, an
# expectation, a connection not kept alive (any Connection value but "keep-alive")
_NOT_PLAIN = frozenset(
    {b"connection", b"content-length", b"expect", b"transfer-encoding", b"upgrade"}
)
_OWS = b" \t"


Split = tuple[str, bytes, list[tuple[bytes, bytes]]]


def split_request_by_expression(data: bytes) -> Split | None:
    """``data`` as one whole GET or HEAD request head and nothing more, kept alive and
    without a body, an upgrade or an expectation: its method, target and header fields
    (names in lower case, values without surrounding whitespace, as uvicorn gives them);
    ``None`` where it is anything else."""
    if len(data) > HEAD_LIMIT:
        return None
    match = _REQUEST.fullmatch(data)
    if match is None:
        return None
    method, target, block = match.groups()
    fields = []
    for line in block.split(b"\r\n")[:-1]:
        name, _, value = line.partition(b":")
        name = name.lower()
        value = value.strip(_OWS)
        if name in _NOT_PLAIN and (name != b"connection" or value.lower() != b"keep-alive"):
            return None
        fields.append((name, value))
    return ("GET" if method == b"GET" else "HEAD"), target, fields


split_request: Callable[[bytes], Split | None] = (
    split_request_by_expression
    if _native is None
    else _native.request_reader(tuple(sorted(_NOT_PLAIN - {b"connection"})))
)


class PlainAnswers:
    """Upstream answers that go down exactly as they came, bytes for bytes: one whole answer
    and nothing more, framed by one ``Content-Length``, with a ``Date``, without
    ``Connection`` or ``Transfer-Encoding`` and without any of ``kept_out`` (the names a
    proxy would drop or rewrite). Any other answer is for the parser and the proxy's header
    rules. One expression checks all of it: the lines either side of the one
    ``Content-Length`` exclude its name and those above, and a ``Date`` line marks an empty
    group as it goes by (an answer without one is left to the parser, which adds it). It has
    no ambiguous repetition, so a match costs time linear in the head's size.

    ``take`` is the C reader where it was built, unless ``native`` is False."""

    take: Callable[[bytes, bool], tuple[int, int] | None]

    def __init__(self, kept_out: frozenset[bytes], native: bool = NATIVE) -> None:
        kept_out = frozenset(name.lower() for name in kept_out)
        names = sorted({*kept_out, b"connection", b"content-length", b"transfer-encoding"})
        barred = b"|".join(re.escape(name) for name in names)
        line = rb"(?:(?i:date)()|(?!(?i:" + barred + rb"):)" + _TOKEN + b"):" + _VALUE + b"\r\n"
        self._pattern = re.compile(
            _STATUS_LINE
            + rb"(?:" + line + rb")*"
            + rb"(?i:content-length):[ \t]*([0-9]{1,%d})[ \t]*\r\n" % LENGTH_DIGITS
            + rb"(?:" + line + rb")*\r\n"
        )  # fmt: skip
        if native and _native is not None:
            self.take = _native.answer_reader(tuple(names))
        else:
            self.take = self.take_by_expression

    def take_by_expression(self, data: bytes, has_body: bool) -> tuple[int, int] | None:
        """``data`` (the answer to a GET where ``has_body``, else to a HEAD) as one such
        answer: its status and where its head ends (the body follows); ``None`` where it is
        anything else (a short body or bytes past it included)."""
        match = self._pattern.match(data)
        if match is None:
            return None
        end = match.end()
        code, date_above, length, date_below = match.groups()  # a Date's group is b"" if seen
        if end > HEAD_LIMIT or (date_above is None and date_below is None):
            return None
        status = int(code)
        body = 0 if not has_body or status == 204 or status == 304 else int(length)
        return (status, end) if len(data) - end == body else None
