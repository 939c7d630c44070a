"""Text for a terminal: names from a trace are data, never commands to the terminal.

An operator, kernel, thread or file name comes from whoever wrote the trace.  Printed raw, an
escape sequence in it (``\\x1b]0;...\\x07``, ``\\x1b[2J``) would retitle or clear the user's
terminal, a bidi override (U+202E) would show the rest of the line reversed, and a line break
would forge a line of the report.  The CLI's text reports pass every line through
:func:`printable_line`, which shows such characters as escapes instead.
"""

from __future__ import annotations

import unicodedata

_SAFE = {"\t"}
"""Control characters kept as they are (a tab only moves the cursor)."""


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable_line(text: str) -> str:
    """``text`` with control, format and line/paragraph-separator characters shown as ``\\xNN`` or
    ``\\uNNNN`` (ordinary text, non-ASCII letters included, is left alone)."""
    if text.isprintable():  # the common case, in C
        return text
    return "".join(
        _escaped(c) if c not in _SAFE and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c
        for c in text
    )
