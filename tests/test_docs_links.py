"""Every relative link of the docs and the README resolves: the file exists, and an anchor names a heading of it.

Pages move (docs/training.md took the trainer out of docs/pretrain.md) and headings get renamed; a link that
pointed there then leads nowhere, silently. Anchors are GitHub's: the heading's text lowercased, inline code
and links reduced to their text, every character but letters, digits, spaces, '-' and '_' dropped, spaces
turned into '-', and '-1', '-2', ... after a repeated one; an HTML ``id``/``name`` counts too. Links to other
sites are not fetched (no network in tests).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_HTML_ID = re.compile(r"<a\s+[^>]*(?:id|name)=\"([^\"]+)\"")


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _prose_lines(text: str) -> list[str]:
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose_lines(text):
        out |= set(_HTML_ID.findall(line))
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(page: Path, root: Path) -> list[str]:
    out = []
    # joined, so that a link whose text wraps onto the next line is still read
    prose = "\n".join(_CODE_SPAN.sub("", line) for line in _prose_lines(page.read_text(encoding="utf-8")))
    for target in _LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
            continue
        path, _, anchor = unquote(target).partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)}: ({target})"
        if not dest.exists():
            out.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            out.append(f"{where}: no heading #{anchor} in {dest.relative_to(root)}")
    return out


@pytest.mark.parametrize("page", pages(REPO), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page, REPO) == []


def test_slugs_are_githubs() -> None:
    assert slug("Requeue on another size (N ranks -> M ranks)") == "requeue-on-another-size-n-ranks---m-ranks"
    assert slug("Where a step spends its time (`--profile-steps`, `--compile`)") == \
        "where-a-step-spends-its-time---profile-steps---compile"
    assert slug("The CRF loss's scale (NER beside other tasks)") == "the-crf-losss-scale-ner-beside-other-tasks"
    assert slug("DeepSpeed configs (`ds_configs/`)") == "deepspeed-configs-ds_configs"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n## A\n") == {"a", "a-1", "a-2"}


def test_a_broken_link_and_anchor_are_caught(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("[ok](docs/a.md#two) [gone](docs/b.md) [bad, wrapped\ntext](docs/a.md#three)\n"
                                        "`[in code](nowhere.md)` [web](https://example.org/x#y)\n")
    (tmp_path / "docs" / "a.md").write_text("# One\n## Two\n[self](#one) [up](../README.md) [no](#four)\n")
    found = [b for p in pages(tmp_path) for b in broken_links(p, tmp_path)]
    assert found == ["README.md: (docs/b.md): no such file",
                     "README.md: (docs/a.md#three): no heading #three in docs/a.md",
                     "docs/a.md: (#four): no heading #four in docs/a.md"]
