"""Projected wall time of the paper's pre-training recipe on GPUs, from FLOPs counted on the real model.

FLOPs per token are counted by torch's FlopCounterMode on a forward+backward of SkillNet-BERT-base
(preset ``base``) for one MLM step (skills s2, s7) and one NSP step (s1, s3, s7) at sequence length
512, on the CPU with a small batch (FLOPs per token do not depend on the batch). The projection then
assumes a peak throughput and a model FLOPs utilisation (MFU); every assumption is printed and written.
The estimator is the reproduction's (``skillnet.experiments.estimate``); this is its bench entry point.

    python bench/projection.py                      # table
    python bench/projection.py --write docs/gpu.md  # also the doc section (written by this script)
    python bench/projection.py --json               # one JSON object as the last line
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from skillnet.experiments.estimate import projection


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mfu", type=float, nargs="+", default=[0.3, 0.45],
                    help="assumed model FLOPs utilisations (fraction of peak)")
    ap.add_argument("--mlm-share", type=float, default=0.5,
                    help="share of steps that are MLM (the objective sampler's default is 50/50)")
    ap.add_argument("--write", metavar="MD", help="write the projection as this Markdown file")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    a = ap.parse_args()
    res = projection(a.mfu, a.mlm_share)
    text = res.pop("markdown")
    print(text)
    if a.write:
        Path(a.write).write_text(text, encoding="utf-8")
    if a.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
