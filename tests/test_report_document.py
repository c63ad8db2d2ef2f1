"""The one report module (finetune/document.py) and how `finetune.compare` uses it: Markdown and HTML of
the same document, the paired-test wording, and the learned-map picture of any learned-map row."""

from __future__ import annotations

import math
from pathlib import Path

from skillnet.finetune import compare
from skillnet.finetune.document import Document, claim, copied_to, decide_claims, verdict


def _png(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG fake")
    return path


def test_markdown_and_html_render_the_same_blocks(tmp_path):
    pic = _png(tmp_path / "run" / "curves.png")
    d = Document()
    d.h(1, "Title <x>")
    d.p("a **bold** and `code` word")
    d.table(["a", "b"], [["1", "2"], ["3", "4"]])
    d.bullets(["one", "two"])
    d.img(pic, "a picture")
    d.code("$ run")
    md = d.markdown(copied_to(tmp_path / "doc" / "img", lambda p: f"r_{p.parent.name}_{p.name}"))
    assert md == ("# Title <x>\n\na **bold** and `code` word\n\n| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n\n"
                  "- one\n- two\n\n![a picture](img/r_run_curves.png)\n\n*a picture*\n\n```\n$ run\n```\n")
    assert (tmp_path / "doc" / "img" / "r_run_curves.png").read_bytes() == pic.read_bytes()
    page = d.html("t")
    assert "<h1>Title &lt;x&gt;</h1>" in page and "<b>bold</b>" in page and "<code>code</code>" in page
    assert "<td>4</td>" in page and "data:image/png;base64," in page and "<li>two</li>" in page
    assert d.markdown().count("](curves.png)") == 1  # by default a picture is linked beside the file


def test_verdict_and_claim_wording():
    # with the bootstrap's interval: bold where it excludes 0
    assert verdict(1.25, 0.01, 3, [0.2, 2.3]) == "**+1.2 [+0.2, +2.3]**"
    assert verdict(-1.0, 0.5, 3, [-2.5, 0.4]) == "-1.0 [-2.5, +0.4]"
    # without per-example statistics the seeds' t-test stands in, and says so
    assert verdict(1.25, 0.01, 3) == "**+1.2** (seeds' t-test p = 0.010, beyond the noise)"
    assert verdict(-1.0, 0.5, 3) == "-1.0 (seeds' t-test p = 0.500, within the noise)"
    assert verdict(2.0, None, 1) == "+2.0 (one seed, no per-example statistics: nothing to judge by)"
    items: list[str] = []
    claim(items, "A beats B", {"diff": -3.0, "p": 0.001}, 3, "A minus B")
    claim(items, "C beats D", None, 3)
    assert decide_claims(items) == [
        "A beats B: **does not hold**: the opposite, beyond the noise (A minus B: -3.0 points, p = 0.001 from the "
        "seeds' t-test (no per-example statistics), Holm-adjusted p = 0.001 over 1 claim, 3 seeds).",
        "C beats D: not measured in this run."]


def test_learned_map_picture_of_a_run_of_only_learnable_eq6(tmp_path):
    """Any row whose runs drew a learned map gets the picture, whatever its method is called (a run of only
    `learnable_eq6` had none)."""
    rows = [compare.Row("skillnet", "skillnet"), compare.Row("learnable_eq6", "learnable_eq6")]
    src = _png(compare.run_dir(tmp_path, "learnable_eq6", 1) / "skill_map.png")
    dest = tmp_path / "skill_map.png"
    assert compare.learned_map_picture(tmp_path, rows, [0, 1], dest) == "learnable_eq6"
    assert dest.read_bytes() == src.read_bytes()
    assert compare.learned_map_picture(tmp_path, rows[:1], [0, 1], tmp_path / "none.png") is None


def test_comparison_document_links_its_pictures(tmp_path):
    def row(v: float) -> dict:
        t = {"ner": {"mean": v, "std": 1.0, "values": [v, v], "metric": "f1"}}
        return {"tasks": t, "average": {"mean": v, "std": 1.0, "values": [v, v]}, "steps": 4,
                "params": {"total": 1000, "trainable": 900, "activated": {"ner": 800}},
                "seconds": {"mean": 3.0, "values": [3.0, 3.0]}}

    agg = {"split": "test", "seeds": [0, 1], "tasks": ["ner"], "methods": {"skillnet": row(50.0), "moe": row(math.nan)}}
    pic = _png(tmp_path / "skill_map.png")
    md = compare.document(agg, {}, "skillnet", "T", {"map": pic}, "cmd").markdown()
    assert "| moe | - | - | 4 | - | 3 s |" in md and md.endswith("![map](skill_map.png)\n\n*map*\n")


def test_a_contents_list_links_every_section_as_github_anchors_it(tmp_path: Path) -> None:
    """A long report opens with its sections, each linked to the anchor GitHub gives its heading (the docs' link
    check reads them the same way), a repeated heading included; the HTML page carries the same anchors."""
    from tests.test_docs_links import anchors, broken_links

    doc = Document()
    doc.h(1, "Report")
    doc.contents()
    for title in ("NLU: Table 3 (`nlu_main`)", "Pre-training", "Pre-training"):
        doc.h(2, title)
        doc.p("text")
    md = doc.markdown()
    assert "- [NLU: Table 3 (`nlu_main`)](#nlu-table-3-nlu_main)" in md
    assert "(#pre-training)" in md and "(#pre-training-1)" in md
    page = tmp_path / "r.md"
    page.write_text(md, encoding="utf-8")
    assert broken_links(page, tmp_path) == []
    assert {"nlu-table-3-nlu_main", "pre-training", "pre-training-1"} <= anchors(md)
    assert "id='pre-training-1'" in doc.html("r") and "href='#nlu-table-3-nlu_main'" in doc.html("r")
