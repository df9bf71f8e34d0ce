"""Text read from files: one check for what a reader accepts, one escape for what is shown of it.

A file's text may not hold a character that changes what a terminal or an editor shows: C0 and C1 control
characters (ESC starts a terminal escape, BEL rings, CR overwrites a line), the Unicode line separators
U+0085, U+2028 and U+2029, which YAML's parser reads as line breaks although no editor shows one, so a key
hidden after them would be read [YAML-1.2 §5.4], and the bidirectional controls (U+202E reverses what
follows it on screen) [Trojan-Source]. Tab and the ordinary line breaks are text.
"""

from __future__ import annotations

import re

LINE_SEPARATORS = "\x85\u2028\u2029"
# Unicode's bidirectional controls: embeddings, overrides, isolates and the implicit marks. An editor or a
# terminal reorders the text around them, so a file can show other than what it holds [Trojan-Source].
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
# What a file's raw text may not hold: control characters but tab, LF and CR (CRLF files), line separators.
_RAW = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029{BIDI_CONTROLS}]")
# What a parsed string may not hold: the same, and CR (written as an escape, it overwrites a line).
_VALUE = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029{BIDI_CONTROLS}]")


def refused(char: str) -> str:
    """Why ``char`` is refused, named by its code point: ``U+001B (ESC), a control character``."""
    code = ord(char)
    if char in LINE_SEPARATORS:
        return f"U+{code:04X}, a line separator no editor shows"
    if re.fullmatch(f"[{BIDI_CONTROLS}]", char):
        return f"U+{code:04X}, a bidirectional control that reorders what an editor shows"
    name = {0x1B: "ESC", 0x07: "BEL", 0x0D: "CR", 0x08: "BS", 0x00: "NUL", 0x7F: "DEL"}.get(code)
    return f"U+{code:04X}{f' ({name})' if name else ''}, a control character"


def unsafe_in_raw(text: str) -> tuple[int, int, str] | None:
    """The (line, column, character), 1-based, of the first character a file's raw text may not hold."""
    match = _RAW.search(text)
    if match is None:
        return None
    start = match.start()
    line = text.count("\n", 0, start) + 1
    return line, start - (text.rfind("\n", 0, start) + 1) + 1, match.group()


def problem_in_value(text: str) -> str | None:
    """Why a parsed string value is refused (a character it may not hold; tab and LF are text), else None."""
    match = _VALUE.search(text)
    return None if match is None else f"{refused(match.group())}, is not accepted in text"


def displayed(text: str) -> str:
    """``text`` safe to show: every control character and line separator but tab and LF written as an
    escape (``\\x1b``, ``\\u2028``), so nothing read from a file moves the cursor, retitles the window or
    rings the bell. Everything shown from a file that a reader did not check goes through this."""
    return _VALUE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
