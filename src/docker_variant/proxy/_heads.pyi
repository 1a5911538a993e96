# The C readers of heads.py (_heads.c); heads.py says what each returns.
from collections.abc import Callable

HEAD_LIMIT: int
LENGTH_DIGITS: int

def request_reader(
    refused: tuple[bytes, ...], /
) -> Callable[[bytes], tuple[str, bytes, list[tuple[bytes, bytes]]] | None]: ...
def answer_reader(
    barred: tuple[bytes, ...], /
) -> Callable[[bytes, bool], tuple[int, int] | None]: ...
