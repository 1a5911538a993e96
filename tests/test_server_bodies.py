"""The one bounded body reader (``oci.bodies``) and the one header-number reader
(``numtext.header_number``), as the servers' ``read_body`` and the clients use them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from starlette.requests import Request

from docker_variant.numtext import HEADER_NUMBER_CAP, header_number
from docker_variant.oci.bodies import BodyLimit, aread_bounded, read_bounded
from docker_variant.server.bodies import BodyTooLargeError, read_body


class Refused(Exception):
    pass


def _refuse(declared: str | None) -> Refused:
    return Refused(declared)


@pytest.mark.parametrize(
    ("value", "number"),
    [
        ("0", 0),
        ("12", 12),
        (" 12\t", 12),
        ("0012", 12),
        ("9" * 18, 10**18 - 1),
        ("9" * 19, HEADER_NUMBER_CAP),
        ("1" + "0" * 5000, HEADER_NUMBER_CAP),  # never an int() of 5,000 digits
        ("0" * 40 + "7", 7),
        (None, None),
        ("", None),
        ("\u00b2", None),  # "²".isdigit() is True and int("²") raises
        ("1\u00b2", None),
        ("\u0663", None),  # ARABIC-INDIC DIGIT THREE: int() takes it, RFC 9110 does not
        ("+1", None),
        ("-1", None),
        ("1.5", None),
        ("1 2", None),
        ("0x10", None),
    ],
)
def test_header_number_takes_ascii_digits_only(value: str | None, number: int | None) -> None:
    assert header_number(value) == number


def _request(headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> Request:
    messages = [{"type": "http.request", "body": c, "more_body": True} for c in chunks]
    messages.append({"type": "http.request", "body": b"", "more_body": False})

    async def receive() -> dict[str, object]:
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    return Request(scope, receive)


def test_a_content_length_that_is_no_ascii_number_is_refused_as_bad_input() -> None:
    """uvicorn refuses "Content-Length: ²" before an app sees it; the reader must not rely
    on that: int("²") raised a bare ValueError out of read_body."""
    request = _request([(b"content-length", "\u00b2".encode("latin-1"))], [b"x"])
    with pytest.raises(BodyTooLargeError, match=r"Content-Length '\u00b2' is not a number"):
        asyncio.run(read_body(request, 10))


def test_read_body_refuses_a_declared_or_streamed_excess_and_keeps_what_fits() -> None:
    declared = _request([(b"content-length", b"11")], [b"x" * 11])
    with pytest.raises(BodyTooLargeError, match="request body of 11 bytes is over the 10"):
        asyncio.run(read_body(declared, 10))
    undeclared = _request([], [b"x" * 6, b"x" * 5])
    with pytest.raises(BodyTooLargeError, match="request body is over the 10 bytes allowed"):
        asyncio.run(read_body(undeclared, 10))
    assert asyncio.run(read_body(_request([], [b"ab", b"cd"]), 4)) == b"abcd"


def test_the_bounded_reader_sync_and_async_alike() -> None:
    async def chunks_of(parts: list[bytes]) -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    parts = [b"abc", b"def", b"ghi"]
    assert read_bounded(iter(parts), BodyLimit(9, _refuse)) == b"abcdefghi"
    assert asyncio.run(aread_bounded(chunks_of(parts), BodyLimit(9, _refuse))) == b"abcdefghi"
    with pytest.raises(Refused) as caught:
        read_bounded(iter(parts), BodyLimit(8, _refuse))
    assert caught.value.args == (None,)  # passed while reading
    with pytest.raises(Refused) as caught:
        asyncio.run(aread_bounded(chunks_of(parts), BodyLimit(8, _refuse, declared=" 9 ")))
    assert caught.value.args == ("9",)  # refused before reading
    # an error body: its head is kept, the rest never read
    read: list[bytes] = []
    head = read_bounded(
        (read.append(p) or p for p in parts), BodyLimit(4, _refuse, declared="9", truncate=True)
    )
    assert head == b"abcd" and len(read) == 2


def test_the_bounded_reader_checks_between_chunks() -> None:
    calls: list[int] = []

    def check() -> None:
        calls.append(1)
        if len(calls) > 2:
            raise TimeoutError("deadline")

    with pytest.raises(TimeoutError):
        read_bounded(iter([b"a"] * 5), BodyLimit(10, _refuse, check=check))
    assert len(calls) == 3
