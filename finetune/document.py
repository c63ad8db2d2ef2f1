"""One small document model for every report the package writes (``finetune.compare``'s comparison,
``finetune.report``'s run page, the reproduction's report): headings, paragraphs, bullet lists, tables,
pictures and code, rendered as Markdown and as one self-contained HTML page (pictures embedded). It also
holds the wording every report uses to judge a difference (finetune/stats.py computes it) and a report's
claims, decided together under Holm's correction.

Inline marks are Markdown's ``**bold**`` and `` `code` ``; the HTML renderer translates those two.
"""

from __future__ import annotations

import base64
import html
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skillnet.finetune.stats import ALPHA, holm, paired_test

__all__ = ["Block", "Claim", "Document", "EMPTY_MARKERS", "claim", "copied_to", "decide_claims", "inline",
           "paired_test", "pyplot", "save_figure", "slug", "verdict"]

# Words a report writes into a section that has nothing to show yet; `Document.problems` flags them.
EMPTY_MARKERS = ("Not run yet", "(none yet)", "No comparison has finished yet")

CSS = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222;line-height:1.45}"
       "img{max-width:100%}table{border-collapse:collapse;margin:1em 0;font-size:.92em}"
       "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f3f3f3}"
       "td:first-child,th:first-child{text-align:left}pre{background:#f6f6f6;padding:.6em;overflow:auto}"
       "figcaption{color:#555;font-size:.9em}")


@dataclass
class Block:
    kind: str  # "h1" "h2" "h3" "p" "table" "img" "code" "list"
    content: Any
    extra: Any = None


def inline(text: str) -> str:
    """Markdown's **bold** and `code` in HTML (the only inline marks the reports use)."""
    t = html.escape(text)
    t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", t)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: code marks and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def copied_to(img_dir: Path, name: Callable[[Path], str]) -> Callable[[Path], str]:
    """A picture link for `Document.markdown` that copies each picture into ``img_dir`` as ``name(path)``
    and links it relative to the folder holding ``img_dir`` (where the Markdown file is)."""
    img_dir.mkdir(parents=True, exist_ok=True)

    def link(path: Path) -> str:
        dst = img_dir / name(path)
        shutil.copyfile(path, dst)
        return f"{img_dir.name}/{dst.name}"

    return link


def pyplot() -> Any:
    """matplotlib.pyplot drawing into files (the Agg backend), for the reports' pictures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 110, **layout: Any) -> None:
    """Lay out `fig` (``tight_layout(**layout)``), write it to `path` and close it."""
    fig.tight_layout(**layout)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


class Document:
    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.missing_images: list[Path] = []

    def h(self, level: int, text: str) -> None:
        self.blocks.append(Block(f"h{level}", text))

    def p(self, text: str) -> None:
        self.blocks.append(Block("p", text))

    def table(self, head: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(Block("table", head, rows))

    def img(self, path: Path, caption: str) -> None:
        """A picture; one whose file is absent is left out and listed by `problems`."""
        if path.is_file():
            self.blocks.append(Block("img", path, caption))
        else:
            self.missing_images.append(path)

    def code(self, text: str) -> None:
        self.blocks.append(Block("code", text))

    def bullets(self, items: list[str]) -> None:
        self.blocks.append(Block("list", items))

    def contents(self) -> None:
        """Here, a list of the document's level-2 sections, linked (rendered from the headings at the end, so
        it may come before them): a long report opens with it."""
        self.blocks.append(Block("contents", None))

    def _sections(self) -> list[tuple[str, str]]:
        """(heading, anchor) of every level-2 heading; anchors as GitHub makes them (a repeated one gets -1, -2)."""
        seen: dict[str, int] = {}
        out = []
        for b in self.blocks:
            if b.kind.startswith("h"):
                s = slug(b.content)
                n = seen.get(s, 0)
                seen[s] = n + 1
                if b.kind == "h2":
                    out.append((b.content, s if n == 0 else f"{s}-{n}"))
        return out

    def problems(self, markers: Sequence[str] = EMPTY_MARKERS) -> list[str]:
        """What makes the document incomplete: a level-2 section with nothing in it or marked as not run
        (one of `markers` in its text), a picture whose file is absent."""
        out = [f"picture missing: {p}" for p in self.missing_images]
        sections: list[tuple[str, list[Block]]] = []
        for b in self.blocks:
            if b.kind == "h2":
                sections.append((b.content, []))
            elif sections and not b.kind.startswith("h"):
                sections[-1][1].append(b)
        for title, body in sections:
            text = " ".join(str(b.content) for b in body if b.kind in ("p", "code", "list"))
            if not body:
                out.append(f"section empty: {title}")
            elif any(m in text for m in markers):
                out.append(f"section not run: {title}")
        return out

    # ---- rendering
    def markdown(self, link: Callable[[Path], str] = lambda p: p.name) -> str:
        """The document as Markdown; ``link(path)`` gives each picture's link (and may copy the file: see
        `copied_to`); by default the picture's file name, for a picture beside the Markdown file."""
        out = []
        for b in self.blocks:
            if b.kind == "contents":
                out.append("Contents:\n\n" + "\n".join(f"- [{h}](#{a})" for h, a in self._sections()))
            elif b.kind.startswith("h"):
                out.append("#" * int(b.kind[1]) + " " + b.content)
            elif b.kind == "p":
                out.append(b.content)
            elif b.kind == "list":
                out.append("\n".join(f"- {x}" for x in b.content))
            elif b.kind == "table":
                out.append("\n".join(["| " + " | ".join(b.content) + " |", "|" + "---|" * len(b.content),
                                      *("| " + " | ".join(r) + " |" for r in b.extra)]))
            elif b.kind == "img":
                out.append(f"![{b.extra}]({link(b.content)})\n\n*{b.extra}*")
            elif b.kind == "code":
                out.append("```\n" + b.content + "\n```")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        """One self-contained HTML page: pictures embedded as data URLs, nothing to fetch."""
        parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style>"]
        anchors = iter(self._sections())
        for b in self.blocks:
            if b.kind == "contents":
                parts.append("<p>Contents:</p><ul>" + "".join(f"<li><a href='#{a}'>{inline(h)}</a></li>"
                                                            for h, a in self._sections()) + "</ul>")
            elif b.kind == "h2":
                parts.append(f"<h2 id='{next(anchors)[1]}'>{inline(b.content)}</h2>")
            elif b.kind.startswith("h"):
                parts.append(f"<{b.kind}>{html.escape(b.content)}</{b.kind}>")
            elif b.kind == "p":
                parts.append(f"<p>{inline(b.content)}</p>")
            elif b.kind == "list":
                parts.append("<ul>" + "".join(f"<li>{inline(x)}</li>" for x in b.content) + "</ul>")
            elif b.kind == "table":
                head = "".join(f"<th>{inline(c)}</th>" for c in b.content)
                body = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in b.extra)
                parts.append(f"<table><tr>{head}</tr>{body}</table>")
            elif b.kind == "img":
                data = base64.b64encode(b.content.read_bytes()).decode("ascii")
                parts.append(f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(b.extra)}'>"
                             f"<figcaption>{html.escape(b.extra)}</figcaption></figure>")
            elif b.kind == "code":
                parts.append(f"<pre>{html.escape(b.content)}</pre>")
        return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------- judging differences
def verdict(diff: float, p: float | None, n: int, ci: Sequence[float] | None = None) -> str:
    """A table cell for a paired difference over `n` seeds: with `ci`, the hierarchical bootstrap's 95% interval
    (finetune/stats.py), bold when it excludes 0 (uncorrected: a cell is not one of the report's claims);
    without, the seeds' paired t-test p stands in (a run kept no per-example statistics)."""
    if ci is not None:
        lo, hi = ci
        cell = f"{diff:+.1f} [{lo:+.1f}, {hi:+.1f}]"
        return f"**{cell}**" if lo > 0 or hi < 0 else cell
    if n < 2:
        return f"{diff:+.1f} (one seed, no per-example statistics: nothing to judge by)"
    if p is None:
        return f"{diff:+.1f} (the same difference on every seed: no spread to judge)"
    if p < ALPHA:
        return f"**{diff:+.1f}** (seeds' t-test p = {p:.3f}, beyond the noise)"
    return f"{diff:+.1f} (seeds' t-test p = {p:.3f}, within the noise)"


@dataclass
class Claim:
    """One of a report's claims, judged once the whole family is known (`decide_claims`): `d` is the paired
    difference (claimed better minus the other over `n` seeds: {"diff", "p", "ci", "p_t", "test"} of
    finetune.stats.difference_entry; None: not measured)."""

    text: str
    d: dict[str, Any] | None
    n: int
    what: str = ""
    p_holm: float | None = None  # Holm-adjusted over the family
    family: int = 0

    def __str__(self) -> str:
        return self.render()

    def __contains__(self, text: str) -> bool:
        """A claim reads as its words (before `decide_claims`, uncorrected) wherever findings are read as text."""
        return text in self.render()

    def render(self) -> str:
        if self.d is None:
            return f"{self.text}: not measured in this run."
        d = self.d
        diff, p, ci, p_t = d["diff"], d.get("p"), d.get("ci"), d.get("p_t", d.get("p"))
        seeds = f"{self.n} seed{'s' if self.n > 1 else ''}"
        parts = [f"{diff:+.1f} points"]
        if ci is not None:
            parts.append(f"95% CI [{ci[0]:+.1f}, {ci[1]:+.1f}], bootstrap p = {p:.3f}")
        elif p is not None:
            parts.append(f"p = {p:.3f} from the seeds' t-test (no per-example statistics)")
        if self.p_holm is not None:
            plural = "s" if self.family != 1 else ""
            parts.append(f"Holm-adjusted p = {self.p_holm:.3f} over {self.family} claim{plural}")
        if ci is not None:
            parts.append("seeds' paired t-test " + (f"p = {p_t:.3f}" if p_t is not None else "undefined"))
        stats = (f"{self.what}: " if self.what else "") + ", ".join(parts) + f", {seeds}"
        beyond = self.p_holm is not None and self.p_holm < ALPHA and (ci is not None or self.n >= 2)
        if diff > 0 and beyond:
            judged = f"**holds** here ({stats})"
        elif diff > 0:
            judged = f"points the same way, **within the noise** ({stats})"
        elif diff < 0 and beyond:
            judged = f"**does not hold**: the opposite, beyond the noise ({stats})"
        elif diff < 0:
            judged = f"points the other way, **within the noise** ({stats})"
        else:
            judged = f"no difference ({stats})"
        return f"{self.text}: {judged}."


def claim(items: list[Any], text: str, d: dict[str, Any] | None, n: int, what: str = "") -> None:
    """Add a claim to a report's findings; `decide_claims` judges the family (Holm) and words each."""
    items.append(Claim(text, d, n, what))


def decide_claims(items: Sequence[Any]) -> list[str]:
    """`items` as text, each `Claim` judged by its Holm-adjusted p over all the measured claims among them (the
    family): a claim holds when the adjusted p is below 0.05, i.e. its interval at the corrected level excludes
    0. A measured claim without a p (the same difference on every seed, no per-example statistics) counts in the
    family as p = 1: it was made, and it is no evidence."""
    family = [c for c in items if isinstance(c, Claim) and c.d is not None]
    pvalues = [1.0 if c.d.get("p") is None else c.d["p"] for c in family]  # type: ignore[union-attr]
    for c, adj in zip(family, holm(pvalues)):
        c.p_holm, c.family = adj, len(family)
    return [c.render() if isinstance(c, Claim) else c for c in items]
