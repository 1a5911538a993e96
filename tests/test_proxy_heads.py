"""The plainest heads, taken without a parser (``proxy/heads.py``): a request head split
there is read exactly as httptools (llhttp, uvicorn's parser) reads it, an answer taken to go
down as it came is one that httptools frames the same way and that carries nothing a proxy
drops or rewrites, and whatever is not plain is left to the parser. Checked on hand-picked
heads and on thousands of mutated ones, for both readers: the C one (``_heads.c``) and the
expressions it stands in for, which must also agree with each other on every head."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import httptools
import pytest

from docker_variant.proxy import heads
from docker_variant.proxy.heads import (
    HEAD_LIMIT,
    LENGTH_DIGITS,
    NATIVE,
    PlainAnswers,
    Split,
    split_request_by_expression,
)

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


@dataclass(frozen=True)
class Readers:
    split_request: Callable[[bytes], Split | None]
    plain: PlainAnswers


EXPRESSIONS = Readers(split_request_by_expression, PlainAnswers(KEPT_OUT, native=False))
NATIVE_READERS = Readers(heads.split_request, PlainAnswers(KEPT_OUT))


@pytest.fixture(params=["native", "expressions"])
def readers(request: pytest.FixtureRequest) -> Readers:
    return NATIVE_READERS if request.param == "native" else EXPRESSIONS


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


def _agrees_on_request(readers: Readers, data: bytes) -> bool:
    """Asserts httptools reads a head that ``split_request`` took the same way: one whole
    message, kept alive, no upgrade, no body; True where it was taken."""
    split = readers.split_request(data)
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


def _agrees_on_answer(readers: Readers, data: bytes, has_body: bool) -> bool:
    """Asserts httptools reads an answer that ``PlainAnswers`` took as one that may go down
    as it came: one HTTP/1.1 message of that status, one ``Content-Length`` framing the
    body as the parser frames it, a ``Date``, none of the names kept out; True where it
    was taken."""
    taken = readers.plain.take(data, has_body)
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


def test_a_plain_request_is_split_as_uvicorn_reads_it(readers: Readers) -> None:
    assert _agrees_on_request(readers, REQUEST)
    method, target, fields = readers.split_request(REQUEST) or ("", b"", [])
    assert (method, target) == ("GET", b"/v2/a/b/manifests/1.0?n=1")
    assert (b"authorization", b"Bearer abc.def") in fields
    assert _agrees_on_request(readers, REQUEST.replace(b"GET", b"HEAD", 1))
    assert _agrees_on_request(readers, b"GET / HTTP/1.1\r\n\r\n")  # no fields at all


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
def test_anything_less_plain_is_left_to_the_parser(
    readers: Readers, change: tuple[bytes, bytes]
) -> None:
    old, new = change
    assert readers.split_request(REQUEST.replace(old, new, 1)) is None


def test_a_head_over_the_limit_is_left_to_the_parser(readers: Readers) -> None:
    long = REQUEST.replace(b"t/1", b"t" * HEAD_LIMIT)
    assert readers.split_request(long) is None
    over = ANSWER.replace(b"sha256:aa\r\n", b"a" * HEAD_LIMIT + b"\r\n")
    assert readers.plain.take(over, True) is None
    # the head ends just past the limit with its last byte
    at_limit = ANSWER.replace(b"X-Empty:", b"X-Empty:" + b"a" * (HEAD_LIMIT - 257))
    size = at_limit.index(b"\r\n\r\n") + 4
    at_limit = at_limit.replace(b"X-Empty:", b"X-Empty:" + b"a" * (HEAD_LIMIT - size), 1)
    assert at_limit.index(b"\r\n\r\n") + 4 == HEAD_LIMIT
    assert readers.plain.take(at_limit, True) == (200, HEAD_LIMIT)
    assert readers.plain.take(at_limit.replace(b"X-Empty:", b"X-Empty:a", 1), True) is None


def test_a_plain_answer_goes_down_as_it_came(readers: Readers) -> None:
    plain = readers.plain
    assert _agrees_on_answer(readers, ANSWER, True)
    assert plain.take(ANSWER, True) == (200, len(ANSWER) - len(BODY))
    head = ANSWER[: -len(BODY)]
    assert _agrees_on_answer(readers, head, False)  # the answer to a HEAD
    assert _agrees_on_answer(readers, head.replace(b"200 OK", b"304 Not Modified"), True)
    assert _agrees_on_answer(
        readers, ANSWER.replace(b"Date", b"dAtE").replace(b"Content-L", b"CONTENT-L"), True
    )
    assert _agrees_on_answer(
        readers, ANSWER.replace(b"X-Empty:", b"Date: Fri, 04 Dec 2026 14:00:01 GMT"), True
    )
    date = b"Date: Fri, 04 Dec 2026 14:00:00 GMT\r\n"
    date_first = ANSWER.replace(date, b"").replace(b"OK\r\n", b"OK\r\n" + date, 1)
    assert date_first != ANSWER and _agrees_on_answer(readers, date_first, True)
    assert plain.take(ANSWER, False) is None  # a HEAD's answer with a body behind it
    longest = b"9" * LENGTH_DIGITS
    huge = head.replace(b"Length: %d" % len(BODY), b"Length: " + longest)  # a HEAD's
    assert plain.take(huge, False) == (200, len(huge))
    assert plain.take(huge.replace(longest, longest + b"9"), False) is None
    # a Date in the body is none in the head
    undated = ANSWER.replace(b"Date: Fri, 04 Dec 2026 14:00:00 GMT\r\n", b"", 1)
    body = b"x\r\nDate: y\r\n"
    length = b"Content-Length: %d"
    undated = undated.replace(length % len(BODY), length % len(body)).replace(BODY, body)
    assert plain.take(undated, True) is None
    assert plain.take(undated.replace(b"X-Empty", b"Date"), True) is not None


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
def test_an_answer_less_plain_is_left_to_the_parser(
    readers: Readers, old: bytes, new: bytes, has_body: bool
) -> None:
    changed = ANSWER.replace(old, new, 1)
    assert changed != ANSWER
    assert readers.plain.take(changed, has_body) is None


_ALPHABET = [b"\r", b"\n", b"\r\n", b" ", b"\t", b":", b"\x00", b"\x7f", b"\x80", b"#", b"?"]
_ALPHABET += [b"a", b"-", b"0", b"\r\n\r\n", b"Content-Length: 3\r\n", b"Connection: close\r\n"]
_ALPHABET += [b"Date: x\r\n", b"Link: y\r\n"]


def _mutated(data: bytes, rng: random.Random, alphabet: list[bytes] = _ALPHABET) -> bytes:
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(data) + 1)
        kind = rng.random()
        if kind < 0.5:
            data = data[:at] + rng.choice(alphabet) + data[at:]
        elif kind < 0.8:
            data = data[:at] + data[at + rng.randint(1, 3) :]
        else:
            data = data[:at] + rng.choice(alphabet) + data[at + 1 :]
    return data


def test_mutated_heads_are_either_read_as_httptools_reads_them_or_left_to_it(
    readers: Readers,
) -> None:
    rng = random.Random(825)
    taken = {"request": 0, "answer": 0, "head": 0}
    for _ in range(4000):
        taken["request"] += _agrees_on_request(readers, _mutated(REQUEST, rng))
        taken["answer"] += _agrees_on_answer(readers, _mutated(ANSWER, rng), True)
        taken["head"] += _agrees_on_answer(readers, _mutated(ANSWER[: -len(BODY)], rng), False)
    # the check means something only if many mutants were taken, and many were not
    assert all(400 < count < 3600 for count in taken.values()), taken


def test_the_c_readers_are_built_and_serve() -> None:
    """The package's set-up builds ``_heads.c``: a build that lost it (and fell back to the
    expressions without a word) fails here."""
    from docker_variant.proxy import _heads

    assert NATIVE and heads.split_request is not split_request_by_expression
    assert NATIVE_READERS.plain.take is not NATIVE_READERS.plain.take_by_expression
    assert (_heads.HEAD_LIMIT, _heads.LENGTH_DIGITS) == (HEAD_LIMIT, LENGTH_DIGITS)
    with pytest.raises(TypeError):
        heads.split_request(bytearray(REQUEST))  # type: ignore[arg-type]
    for make_reader in (_heads.request_reader, _heads.answer_reader):
        with pytest.raises(ValueError, match="lower-case"):
            make_reader((b"Link",))
        with pytest.raises(TypeError):
            make_reader([b"link"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        NATIVE_READERS.plain.take(ANSWER)  # type: ignore[call-arg]


# the mutation alphabet, widened with what each reader decides on: names in any case,
# lengths of every size, the request line's parts
_WIDE = [b"CONTENT-LENGTH: 12\r\n", b"dAtE: z\r\n", b"TE: x\r\n", b"connection: Keep-Alive\r\n"]
_WIDE += [b"Expect: a\r\n", b"1" * LENGTH_DIGITS, b"HEAD", b" HTTP/1.1", b"\xff", b"9", b"x:"]


def test_every_name_that_makes_a_request_less_plain_is_refused_by_both_readers() -> None:
    """The C reader takes its names from ``heads`` (one list for both readers)."""
    for name in heads._NOT_PLAIN - {b"connection"}:
        for spelled in (name, name.upper()):
            request = REQUEST.replace(b"User-Agent", spelled + b": x\r\nUser-Agent", 1)
            assert split_request_by_expression(request) is None, request
            assert heads.split_request(request) is None, request


def test_the_c_readers_agree_with_the_expressions_on_every_mutant() -> None:
    rng = random.Random(817)
    alphabet = _ALPHABET + _WIDE
    taken = 0
    for _ in range(20000):
        request = _mutated(REQUEST, rng, alphabet)
        assert heads.split_request(request) == split_request_by_expression(request), request
        answer = _mutated(ANSWER if rng.random() < 0.5 else ANSWER[: -len(BODY)], rng, alphabet)
        for has_body in (True, False):
            native = NATIVE_READERS.plain.take(answer, has_body)
            assert native == EXPRESSIONS.plain.take(answer, has_body), (answer, has_body)
            taken += native is not None
    assert 2000 < taken < 18000, taken
    # every cut of a head: where a reader would run past the bytes it has
    for whole in (REQUEST, ANSWER, ANSWER[: -len(BODY)]):
        for cut in range(len(whole) + 1):
            part = whole[:cut]
            assert heads.split_request(part) == split_request_by_expression(part), part
            for has_body in (True, False):
                native = NATIVE_READERS.plain.take(part, has_body)
                assert native == EXPRESSIONS.plain.take(part, has_body), (part, has_body)
