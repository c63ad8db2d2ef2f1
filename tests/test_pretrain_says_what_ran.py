"""Pre-training's records mean what they say (issue 50, items 3, 4 and 8): the TensorBoard scalars are the ones
docs/pretrain.md names, with no loss averaged over objectives; a dry run refuses what the launch would refuse,
in one line; options that cannot do what they say are refused; run_args.json and the start log record what
ran, segment by segment."""

from __future__ import annotations

import json
import re
from pathlib import Path

from skillnet.pretrain import run as run_mod

from tests.fixtures.pretrain.helpers import REPO

TINY = ["--synthetic", "64", "--synthetic_vocab", "1024", "--max_seq_len", "16", "--micro_batch_size", "2",
        "--no_progress"]


def _observability_names() -> list[str]:
    """The TensorBoard names docs/pretrain.md's "Observability" section gives for a SkillNet-BERT run."""
    doc = (REPO / "docs" / "pretrain.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Observability"):]
    section = section[: section.index("\n## ", 1)]
    names = re.findall(r"`((?:train|eval)/[^`]+)`", section)
    # BART's names, and a counter that exists once a step was skipped, are not this run's.
    return [n for n in names if "denoise" not in n and n != "train/skipped_steps"]


def test_tensorboard_holds_the_documented_scalars_and_no_mixed_loss(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert run_mod.main([*TINY, "--max_steps", "4", "--log_every", "2", "--eval_every", "2", "--eval_batches", "1",
                         "--output_dir", str(out)]) == 0
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    documented = _observability_names()
    assert "train/mlm/loss" in documented and "eval/nsp/acc" in documented
    patterns = {n: re.compile(re.sub(r"<[a-z]+>", "[^/]+", re.escape(n)))
                for n in documented}
    missing = [n for n, p in patterns.items() if not any(p.fullmatch(t) for t in tags)]
    assert not missing, f"documented but not in TensorBoard: {missing}"
    undocumented = sorted(t for t in tags if not any(p.fullmatch(t) for p in patterns.values()))
    assert not undocumented, f"in TensorBoard but not in docs/pretrain.md 'Observability': {undocumented}"
    # No loss averaged over objectives, in TensorBoard or in log.jsonl.
    assert "train/loss" not in tags and "eval/loss" not in tags
    lines = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert lines and not any("loss" in rec for rec in lines)
    assert any("mlm/loss" in rec and "nsp/loss" in rec for rec in lines if rec["split"] == "train")
