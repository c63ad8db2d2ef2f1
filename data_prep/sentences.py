"""Which full stops end a sentence, for text that is not Chinese.

In Chinese text "." is rare and 。！？ end sentences; the build's token-level rule (every ender ends a
sentence, except a "." before a number) is right there. In English and other Latin-script text the full
stop is also the dot of ``sys.argv``, ``e.g.``, ``3.14``, ``Mr. Smith`` and ``example.com``, so that rule
cuts sentences into fragments and NSP pairs start in the middle of one. ``plain_dots`` reads the text of a
document and returns, for each "." in it, whether it does *not* end a sentence:

* the next character is a letter, digit, "_", "," ";" or ":" (``sys.argv``, ``3.14``, ``e.g.``'s first
  dot, ``etc., and``);
* the word before is a title or a Latin abbreviation (``Mr.``, ``Dr.``, ``vs.``, ``et al.``; see TITLES),
  a capital letter other than "I" (an initial: ``J. Smith``) or a dotted word (``e.g.``, ``U.S.``, ``Ph.D.``);
* the word before is one that numbers follow (``Fig. 3``, ``No. 5``, ``pp. 12``: NUMBERED) and a digit
  follows;
* a lower-case letter follows, in a document that has upper-case letters (``approx. five``); in a text
  that is lower-case throughout this says nothing, and is not used.

Modes (``data_prep build --sentence-split``): ``punct`` is the token rule alone, for every document (the
behaviour before this module existed); ``latin`` adds the rules above for every document; ``auto`` (the
default) adds them to documents without a CJK character, so a Chinese corpus builds exactly as with
``punct``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MODES = ("auto", "latin", "punct")

# Words before a "." that never end a sentence (lower-case, without the dot).
TITLES = frozenset(
    ["mr", "mrs", "ms", "mx", "dr", "prof", "sr", "jr", "st", "mt", "ft", "rev", "hon", "gen", "col", "lt", "capt", "sgt", "cmdr", "gov", "sen", "rep", "pres", "vs", "cf", "al", "approx", "ca", "viz", "resp"]
)
# Words before a "." that a number follows ("Fig. 3"): no sentence end only when a digit comes next.
NUMBERED = frozenset(["no", "nos", "fig", "figs", "eq", "eqs", "vol", "vols", "pp", "p", "ch", "sec", "art", "ref", "refs", "tab", "ex"])

_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
_DOT = re.compile(r"\.")
_WORD_BEFORE = re.compile(r"[A-Za-z]+(?:\.[A-Za-z]+)*$")
_CLOSERS = "\"'”’)]}»"


def is_latin(doc: str, mode: str) -> bool:
    """Whether the "." rules apply to this document under ``mode``."""
    if mode == "punct":
        return False
    return mode == "latin" or _CJK.search(doc) is None


def plain_dots(doc: str, abbreviations: Iterable[str] = ()) -> list[bool]:
    """For each "." of ``doc`` in order: True when it does not end a sentence (module docstring).
    ``abbreviations``: more words that never end a sentence before a ".", lower-case, without the dot."""
    titles = TITLES | frozenset(abbreviations) if abbreviations else TITLES
    cased = any(c.isupper() for c in doc)
    out = []
    n = len(doc)
    for m in _DOT.finditer(doc):
        i = m.start()
        nxt = doc[i + 1] if i + 1 < n else ""
        if nxt and (nxt.isascii() and (nxt.isalnum() or nxt in "_,;:")):
            out.append(True)
            continue
        w = _WORD_BEFORE.search(doc, max(0, i - 32), i)
        raw = w.group(0) if w else ""
        word = raw.lower()
        initial = len(raw) == 1 and raw.isupper() and raw != "I"  # "J. Smith"; "than I." ends one
        if word and (word in titles or initial or "." in word):
            out.append(True)
            continue
        j = i + 1
        while j < n and doc[j] in _CLOSERS:
            j += 1
        while j < n and doc[j].isspace():
            j += 1
        after = doc[j] if j < n else ""
        out.append(bool(after) and ((word in NUMBERED and after.isdigit()) or (cased and after.islower())))
    return out
