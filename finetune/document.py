"""One small document model for every report the package writes (``finetune.compare``'s comparison,
``finetune.report``'s run page, the reproduction's report): headings, paragraphs, bullet lists, tables,
pictures and code, rendered as Markdown and as one self-contained HTML page (pictures embedded). It also
holds the paired test over seeds and the wording every report uses to judge a difference by it.

Inline marks are Markdown's ``**bold**`` and `` `code` ``; the HTML renderer translates those two.
"""

from __future__ import annotations

import base64
import html
import re
import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Block", "Document", "EMPTY_MARKERS", "claim", "copied_to", "inline", "paired_test", "pyplot", "save_figure",
           "verdict"]

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
            if b.kind.startswith("h"):
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
        for b in self.blocks:
            if b.kind.startswith("h"):
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
def paired_test(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided paired t-test p-value over seeds; None with fewer than 2 pairs or when every seed gives the
    same difference (no spread: the test is undefined, and two identical differences, e.g. two tied
    predictions of a majority class, are no evidence either way). Equal values: p = 1."""
    if len(a) != len(b) or len(a) < 2:
        return None
    d = [x - y for x, y in zip(a, b)]
    # Differences equal up to float rounding (0.3 against 1.3 - 1.0) are the same gap: scipy would see a
    # spread of 1e-17 and call any such gap certain.
    tol = 1e-9 * max(1.0, *map(abs, [*a, *b]))
    if statistics.stdev(d) <= tol:
        return 1.0 if abs(statistics.fmean(d)) <= tol else None
    from scipy import stats

    return float(stats.ttest_rel(a, b).pvalue)


def verdict(diff: float, p: float | None, n: int) -> str:
    """A table cell for a paired difference over `n` seeds: bold when beyond the noise (p < 0.05)."""
    if n < 2:
        return f"{diff:+.1f} (one seed: no spread to judge)"
    if p is None:
        return f"{diff:+.1f} (the same difference on every seed: no spread to judge)"
    if p < 0.05:
        return f"**{diff:+.1f}** (p = {p:.3f}, beyond the noise)"
    return f"{diff:+.1f} (p = {p:.3f}, within the noise)"


def claim(items: list[str], text: str, d: dict[str, Any] | None, n: int, what: str = "") -> None:
    """One bullet on a claim, judged by the paired difference `d` ({"diff", "p"}: claimed better minus the
    other, over `n` seeds): holds beyond the noise / same direction within the noise / other direction
    within the noise / the opposite holds beyond the noise."""
    if d is None:
        items.append(f"{text}: not measured in this run.")
        return
    diff, p = d["diff"], d["p"]
    beyond = p is not None and p < 0.05 and n >= 2
    stats = (f"{what}: " if what else "") + f"{diff:+.1f} points" + (f", p = {p:.3f}" if p is not None else "") \
        + f", {n} seed{'s' if n > 1 else ''}"
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
    items.append(f"{text}: {judged}.")
