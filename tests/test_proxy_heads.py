"""The plainest heads, taken without a parser (``proxy/heads.py``): a request head split
there is read exactly as httptools (llhttp, uvicorn's parser) reads it, an answer taken to go
down as it came is one that httptools frames the same way and that carries nothing a proxy
drops or rewrites, and whatever is not plain is left to the parser. Checked on hand-picked
heads and on thousands of mutated ones."""

from __future__ import annotations

import random

import httptools
import pytest

from docker_variant.proxy.heads import HEAD_LIMIT, PlainAnswers, split_request

REQUEST = (
    b"GET /v2/a/b/manifests/1.0?n=1 HTTP/1.1\r\nHost: 127.0.0.1:5000\r\n"
    b"Accept: application/vnd.oci.image.manifest.v1+json, */*\r\n"
    b"Authorization:   Bearer abc.def  \r\nConnection: keep-alive\r\nUser-Agent: t/1\r\n\r\n"
)
BODY = b'{"schemaVersion": 2}'
ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: application/json\r\n"
    b'Docker-Content-Digest: sha256:aa\r\nEtag: "sha256:aa"\r\nX-Empty:\r\n'
    b"Date: Fri, 04 Dec 2026 14:00:00 GMT\r\n\r\n" % len(BODY)
) + BODY
# what a proxy drops or rewrites, besides the framing and Connection that PlainAnswers bars
KEPT_OUT = frozenset({b"keep-alive", b"te", b"location", b"link"})
PLAIN = PlainAnswers(KEPT_OUT)


class _Request:
    """What uvicorn takes from httptools for a request head."""

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.messages = 0
        self.begun = 0

    def on_message_begin(self) -> None:
        self.begun += 1

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value.rstrip(b" \t")))  # as uvicorn does

    def on_message_complete(self) -> None:
        self.messages += 1


class _Answer:
    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""
        self.headers_done = False
        self.messages = 0
        self.begun = 0

    def on_message_begin(self) -> None:
        self.begun += 1

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value.strip(b" \t")))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.messages += 1


def _agrees_on_request(data: bytes) -> bool:
    """Asserts httptools reads a head that ``split_request`` took the same way: one whole
    message, kept alive, no upgrade, no body; True where it was taken."""
    split = split_request(data)
    if split is None:
        return False
    seen = _Request()
    parser = httptools.HttpRequestParser(seen)
    parser.feed_data(data)  # raises where httptools refuses what was taken
    method, target, fields = split
    assert (seen.begun, seen.messages) == (1, 1), data
    assert parser.get_method().decode() == method and seen.url == target, data
    assert parser.get_http_version() == "1.1" and parser.should_keep_alive(), data
    assert not parser.should_upgrade(), data
    assert fields == seen.headers, data
    framing = {b"content-length", b"transfer-encoding", b"expect", b"upgrade"}
    assert not framing & {name for name, _ in fields}, data
    return True


def _agrees_on_answer(data: bytes, has_body: bool) -> bool:
    """Asserts httptools reads an answer that ``PlainAnswers`` took as one that may go down
    as it came: one HTTP/1.1 message of that status, one ``Content-Length`` framing the
    body as the parser frames it, a ``Date``, none of the names kept out; True where it
    was taken."""
    taken = PLAIN.take(data, has_body)
    if taken is None:
        return False
    seen = _Answer()
    parser = httptools.HttpResponseParser(seen)
    parser.feed_data(data)
    status, head_end = taken
    assert seen.headers_done and seen.begun == 1, data
    assert parser.get_status_code() == status and parser.get_http_version() == "1.1", data
    names = [name for name, _ in seen.headers]
    assert b"date" in names and names.count(b"content-length") == 1, data
    assert not (KEPT_OUT | {b"transfer-encoding", b"connection"}) & set(names), data
    if has_body and status not in (204, 304):
        assert seen.messages == 1 and data[head_end:] == seen.body, data
    else:
        assert head_end == len(data), data
    assert data[head_end - 4 : head_end] == b"\r\n\r\n", data
    return True


def test_a_plain_request_is_split_as_uvicorn_reads_it() -> None:
    assert _agrees_on_request(REQUEST)
    method, target, fields = split_request(REQUEST) or ("", b"", [])
    assert (method, target) == ("GET", b"/v2/a/b/manifests/1.0?n=1")
    assert (b"authorization", b"Bearer abc.def") in fields
    assert _agrees_on_request(REQUEST.replace(b"GET", b"HEAD", 1))


@pytest.mark.parametrize(
    "change",
    [
        (b"HTTP/1.1\r\n", b"HTTP/1.0\r\n"),  # not kept alive by default
        (b"GET ", b"POST "),
        (b"GET ", b"GET  "),
        (b"/v2/a", b"http://h/v2/a"),  # absolute-form
        (b"?n=1", b"#frag"),
        (b"Host: ", b"Host : "),  # whitespace before the colon
        (b"Host: ", b"Ho\x00st: "),
        (b"t/1\r\n", b"t/1\r\n continued\r\n"),  # obsolete line folding
        (b"t/1\r\n", b"t/1\n"),  # a bare LF
        (b"t/1\r\n", b"t\r/1\r\n"),  # a bare CR
        (b"t/1\r\n", b"t/\x011\r\n"),  # a control byte
        (b"keep-alive", b"close"),
        (b"keep-alive", b"keep-alive, Upgrade"),
        (b"t/1\r\n", b"t/1\r\nContent-Length: 0\r\n"),
        (b"t/1\r\n", b"t/1\r\nTransfer-Encoding: chunked\r\n"),
        (b"t/1\r\n", b"t/1\r\nExpect: 100-continue\r\n"),
        (b"t/1\r\n", b"t/1\r\nUpgrade: websocket\r\n"),
        (b"\r\n\r\n", b"\r\n\r\nGET / HTTP/1.1\r\n\r\n"),  # a pipelined request behind it
        (b"\r\n\r\n", b"\r\n"),  # not whole yet
    ],
)
def test_anything_less_plain_is_left_to_the_parser(change: tuple[bytes, bytes]) -> None:
    old, new = change
    assert split_request(REQUEST.replace(old, new, 1)) is None


def test_a_head_over_the_limit_is_left_to_the_parser() -> None:
    long = REQUEST.replace(b"t/1", b"t" * HEAD_LIMIT)
    assert split_request(long) is None
    assert PLAIN.take(ANSWER.replace(b"sha256:aa\r\n", b"a" * HEAD_LIMIT + b"\r\n"), True) is None


def test_a_plain_answer_goes_down_as_it_came() -> None:
    assert _agrees_on_answer(ANSWER, True)
    assert PLAIN.take(ANSWER, True) == (200, len(ANSWER) - len(BODY))
    head = ANSWER[: -len(BODY)]
    assert _agrees_on_answer(head, False)  # the answer to a HEAD
    assert _agrees_on_answer(head.replace(b"200 OK", b"304 Not Modified"), True)
    assert _agrees_on_answer(
        ANSWER.replace(b"Date", b"dAtE").replace(b"Content-L", b"CONTENT-L"), True
    )
    assert _agrees_on_answer(
        ANSWER.replace(b"X-Empty:", b"Date: Fri, 04 Dec 2026 14:00:01 GMT"), True
    )
    date = b"Date: Fri, 04 Dec 2026 14:00:00 GMT\r\n"
    date_first = ANSWER.replace(date, b"").replace(b"OK\r\n", b"OK\r\n" + date, 1)
    assert date_first != ANSWER and _agrees_on_answer(date_first, True)  # above the length
    assert PLAIN.take(ANSWER, False) is None  # a HEAD's answer with a body behind it
    # a Date in the body is none in the head
    undated = ANSWER.replace(b"Date: Fri, 04 Dec 2026 14:00:00 GMT\r\n", b"", 1)
    body = b"x\r\nDate: y\r\n"
    length = b"Content-Length: %d"
    undated = undated.replace(length % len(BODY), length % len(body)).replace(BODY, body)
    assert PLAIN.take(undated, True) is None
    assert PLAIN.take(undated.replace(b"X-Empty", b"Date"), True) is not None


@pytest.mark.parametrize(
    ("old", "new", "has_body"),
    [
        (BODY, BODY[:-1], True),  # short
        (BODY, BODY + b"x", True),  # bytes past the body
        (b"200 OK", b"100 Continue", True),
        (b"HTTP/1.1", b"HTTP/1.0", True),
        (b"Content-Length: ", b"Content-Length: +", True),
        (b"Content-Length: ", b"Content-Length: " + b"0" * 5000, True),  # int() refuses it
        (b"Content-Type", b"Transfer-Encoding: chunked\r\nContent-Type", True),
        (b"Content-Type", b"Connection: close\r\nContent-Type", True),
        (b"Content-Type", b"Content-Length: 1\r\nContent-Type", True),
        (b"Content-Type", b"Keep-Alive: timeout=5\r\nContent-Type", True),  # kept out
        (b"Content-Type", b"location: /v2/\r\nContent-Type", True),
        (b"X-Empty:", b"LINK: </v2/a>", True),
        (b"Date:", b"X-Date:", True),  # no Date: the proxy adds one
        (b"Date:", b"Date :", True),
        (b"Etag: ", b"Etag : ", True),
        (b"Etag: ", b"Etag:\n ", True),
    ],
)
def test_an_answer_less_plain_is_left_to_the_parser(old: bytes, new: bytes, has_body: bool) -> None:
    changed = ANSWER.replace(old, new, 1)
    assert changed != ANSWER
    assert PLAIN.take(changed, has_body) is None


_ALPHABET = [b"\r", b"\n", b"\r\n", b" ", b"\t", b":", b"\x00", b"\x7f", b"\x80", b"#", b"?"]
_ALPHABET += [b"a", b"-", b"0", b"\r\n\r\n", b"Content-Length: 3\r\n", b"Connection: close\r\n"]
_ALPHABET += [b"Date: x\r\n", b"Link: y\r\n"]


def _mutated(data: bytes, rng: random.Random) -> bytes:
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(data) + 1)
        kind = rng.random()
        if kind < 0.5:
            data = data[:at] + rng.choice(_ALPHABET) + data[at:]
        elif kind < 0.8:
            data = data[:at] + data[at + rng.randint(1, 3) :]
        else:
            data = data[:at] + rng.choice(_ALPHABET) + data[at + 1 :]
    return data


def test_mutated_heads_are_either_read_as_httptools_reads_them_or_left_to_it() -> None:
    rng = random.Random(825)
    taken = {"request": 0, "answer": 0, "head": 0}
    for _ in range(4000):
        taken["request"] += _agrees_on_request(_mutated(REQUEST, rng))
        taken["answer"] += _agrees_on_answer(_mutated(ANSWER, rng), True)
        taken["head"] += _agrees_on_answer(_mutated(ANSWER[: -len(BODY)], rng), False)
    # the check means something only if many mutants were taken, and many were not
    assert all(400 < count < 3600 for count in taken.values()), taken
