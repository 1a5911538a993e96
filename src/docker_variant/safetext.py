"""The one way to print text that came from outside (a registry, an index, an image's
annotations or file names, the engine, a providers file): ``safe_text``.

A terminal obeys control characters (ESC starts colour changes, cursor moves, window-title
and hyperlink sequences; BEL rings; CR overwrites the line), and rich reads ``[...]`` as
markup (``[link=...]`` makes a hyperlink; an unbalanced ``[/x]`` raises). ``safe_text``
shows each control character as its Python escape (``\\x1b``, ``\\x07``, ``\\r``, ``\\n``)
and, for text that rich will parse, escapes the markup, so the text appears as it is.
"""

from __future__ import annotations

__all__ = ["safe_text"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

# C0 controls, DEL, C1 controls, and the bidirectional overrides and isolates (which make
# a terminal show text in an order other than its bytes').
_CONTROLS = [
    *range(0x00, 0x20),
    0x7F,
    *range(0x80, 0xA0),
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_ESCAPES = {
    code: _NAMED.get(chr(code)) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    for code in _CONTROLS
}


def safe_text(value: object, *, markup: bool) -> str:
    """``str(value)`` with every control character shown as an escape; with ``markup``
    (the text goes into a rich table, a rich ``print`` or a progress bar's description),
    also with rich's markup escaped."""
    text = str(value).translate(_ESCAPES)
    if not markup:
        return text
    from rich.markup import escape  # rich is loaded already wherever markup is parsed

    return escape(text)
