"""What the benchmark scripts share: paired ratios and doc sections written by the script that measured them.

A ratio of two timings is only a figure when machine load hits both arms alike, so the benches run the
arms interleaved (A B A B ...) and report the median of the per-repetition ratios with its range;
``paired_ratio`` computes those. ``write_section`` replaces one marked section of a Markdown file:

    <!-- bench:NAME:begin -->
    ... everything here is rewritten by the bench ...
    <!-- bench:NAME:end -->

so a doc can mix prose written by hand with figures that only a measuring script may change.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from skillnet.common.files import atomic_write_text


def paired_ratio(num: Sequence[float], den: Sequence[float], key: str, digits: int = 3) -> dict[str, float]:
    """``{key: median, key_min: min, key_max: max}`` of ``num[i] / den[i]`` over the repetitions.

    ``num`` and ``den`` must come from the same repetitions in order (interleaved arms), so each ratio
    compares two timings taken under the same load.
    """
    if len(num) != len(den) or not num:
        raise ValueError(f"paired_ratio: need equally many repetitions of both arms, got {len(num)} and {len(den)}")
    ratios = [a / b for a, b in zip(num, den)]
    return {
        key: round(statistics.median(ratios), digits),
        f"{key}_min": round(min(ratios), digits),
        f"{key}_max": round(max(ratios), digits),
    }


def interleaved(fns: dict[str, Callable[[], Any]], warmup: int, reps: int) -> dict[str, list[Any]]:
    """Call each fn `warmup` times, then `reps` rounds of one call each, alternating: machine load in
    any round hits every model alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out: dict[str, list[Any]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            out[name].append(fn())
    return out


def machine_line() -> str:
    """One line saying where and when a figure was measured (a doc figure without it cannot be judged)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"Measured {now} on {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, load average {load:.1f} at the end of the run.")


def _markers(name: str) -> tuple[str, str]:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"section name {name!r}: use letters, digits, '_', '.', '-'")
    return f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"


def replace_section(text: str, name: str, body: str) -> str:
    """``text`` with the section ``name`` holding ``body``; ValueError if its markers are missing or repeated."""
    begin, end = _markers(name)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"expected one '{begin}' followed by one '{end}'")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{body.strip()}\n{end}{tail}"


def write_section(path: str | os.PathLike, name: str, body: str) -> None:
    """Rewrite the section ``name`` of the Markdown file ``path``; a file without the markers is an error
    (add them where the figures belong), so a bench never overwrites prose written by hand."""
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"error: --write {p}: no such file")
    try:
        new = replace_section(p.read_text(encoding="utf-8"), name, body)
    except ValueError as e:
        raise SystemExit(f"error: --write {p}: {e}") from None
    atomic_write_text(p, new)
    print(f"wrote section '{name}' of {p}")


def md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table; floats as given (format them before)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def encoder_step_flops(H: int, L: int, V: int, W: int, tokens: int, attn_pairs: int, objective: str,
                       masked: int, samples: int) -> float:
    """Matmul FLOPs of forward + backward (3 x forward) of one BERT pre-training step: ``tokens`` token slots
    through the projections and an FFN of width W (the activated skills), ``attn_pairs`` query-key pairs
    (QK^T and PV), then the MLM head at ``masked`` positions or the NSP head on ``samples`` pooled outputs.
    Padded rows: tokens = B*T, attn_pairs = B*T^2. The useful work of the same samples: tokens = sum L_i,
    attn_pairs = sum L_i^2 (what a variable-length kernel computes)."""
    per_layer = 2 * tokens * (4 * H * H + 2 * H * W) + 4 * attn_pairs * H
    head = 2 * masked * (H * H + H * V) if objective == "mlm" else 2 * samples * (H * H + 2 * H)
    return 3.0 * (L * per_layer + head)
