"""The plainest request heads, checked by one regular expression and split by bytes methods.

Most manifest GETs come as one segment: a whole request head, kept alive, without a body.
uvicorn's parser callbacks and the request cycle around them (a Python call per header, a
scope built field by field) were a large part of the proxy's own time for them, so a head
that fits the strict grammar below is split here instead; any other (HTTP/1.0, a bare CR or
LF, a control byte, obsolete line folding, a body, an upgrade, an expectation, a head in
pieces or with the next request behind it...) returns ``None`` and goes to uvicorn's parser
as before. The grammar is RFC 9112's, narrowed: nothing is taken here that httptools would
refuse or frame differently.

The expression has no ambiguous repetition (a header line is a token, a colon, value bytes
that are never CR or LF, and CRLF), so a match costs time linear in the head's size.
"""

from __future__ import annotations

import re

__all__ = ["HEAD_LIMIT", "LENGTH_DIGITS", "split_answer", "split_request"]

HEAD_LIMIT = 16 << 10  # longer heads go to the parser
# a Content-Length of more digits is no length here (int() refuses over 4,300 digits, and
# llhttp any length past 2**64)
LENGTH_DIGITS = 18

# a GET or HEAD of an origin-form target (no '#'), then header lines of an RFC 9110 token,
# a colon and a value of VCHAR, SP, HTAB and obs-text, then the blank line, then nothing
_FIELDS = rb"((?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e\x80-\xff]*\r\n)*)\r\n"
_REQUEST = re.compile(rb"(GET|HEAD) (/[!-\x22\x24-\x7e]*) HTTP/1\.1\r\n" + _FIELDS)
# an HTTP/1.1 status line of a final status (2xx to 5xx), then header lines as above
_ANSWER = re.compile(rb"HTTP/1\.1 ([2-5][0-9][0-9]) [\t\x20-\x7e\x80-\xff]*\r\n" + _FIELDS)
# request headers that make a request other than the plainest: a body, an upgrade, an
# expectation, a connection not kept alive (any Connection value but "keep-alive")
_NOT_PLAIN = frozenset(
    {b"connection", b"content-length", b"expect", b"transfer-encoding", b"upgrade"}
)
# answer headers that frame it (one Content-Length is the plainest answer) or its connection
_FRAMING = frozenset({b"connection", b"content-length", b"transfer-encoding"})
_OWS = b" \t"


def split_request(data: bytes) -> tuple[str, bytes, list[tuple[bytes, bytes]]] | None:
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


def split_answer(
    data: bytes, has_body: bool, notable: frozenset[bytes] = frozenset()
) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool] | None:
    """``data`` as one whole answer (to a GET where ``has_body``, else to a HEAD) and
    nothing more, framed by one ``Content-Length``, without ``Connection`` or
    ``Transfer-Encoding``: its status, header fields (as ``split_request``'s), body, and
    whether it is as plain as can be: a ``Date``, and none of the ``notable`` names (those
    the caller would drop or rewrite: then it need not look at the fields again);
    ``None`` where it is anything else (a short body or bytes past it included)."""
    match = _ANSWER.match(data)
    if match is None or match.end() > HEAD_LIMIT:
        return None
    status = int(match[1])
    length = -1
    dated = False
    plain = True
    fields = []
    for line in match[2].split(b"\r\n")[:-1]:
        name, _, value = line.partition(b":")
        name = name.lower()
        value = value.strip(_OWS)
        if name in _FRAMING:
            if (
                name != b"content-length"
                or length >= 0
                or not value.isdigit()
                or len(value) > LENGTH_DIGITS
            ):
                return None
            length = int(value)
        elif name == b"date":
            dated = True
        elif name in notable:
            plain = False
        fields.append((name, value))
    body = data[match.end() :]
    if not has_body or status == 204 or status == 304:
        if body:
            return None
    elif len(body) != length:
        return None
    return status, fields, body, plain and dated
