"""bench/deploy.py's BART generation arms: the padded plain model, its trimmed form and the sparse model are
timed on the same inputs with each ratio reported, and --presets takes a profile's shape (no timing
assertions: the figures are the bench's, on a shared CPU)."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_deploy", REPO / "bench" / "deploy.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_presets_take_model_presets_and_profiles() -> None:
    from skillnet.model import SkillNetBartConfig, SkillNetBertConfig

    d = _bench()
    assert d._config(SkillNetBartConfig, "full", "bart", {}).d_model == 128  # the full profile's BART
    assert d._config(SkillNetBertConfig, "full", "bert", {}).hidden_size == 128
    assert d._config(SkillNetBartConfig, "base", "bart", {}).d_model == 768
    with pytest.raises(SystemExit, match="neither a preset"):
        d._config(SkillNetBartConfig, "scale", "bart", {})  # a profile without sizes of its own


def test_bart_speed_times_every_arm_and_the_padding_cost() -> None:
    from skillnet.export.flatten import plain_bart
    from skillnet.model.bart import SkillNetBartConfig, SkillNetBartForConditionalGeneration

    d = _bench()
    torch.manual_seed(0)
    m = SkillNetBartForConditionalGeneration(SkillNetBartConfig.preset("tiny")).eval()
    flat = plain_bart(m, "dialogue_generation")
    flat.model.generation_config = copy.deepcopy(flat.model.generation_config)
    arms = d.bart_arms(flat.model, flat.widths, None, {})
    assert set(arms) == {"plain", "trimmed"}
    assert [la.fc1.out_features for la in arms["trimmed"].model.encoder.layers] == flat.widths[:2]
    def tok(texts: list[str], **_: object) -> dict[str, torch.Tensor]:  # one id per character, right-padded
        ids = torch.zeros(len(texts), max(map(len, texts)), dtype=torch.long)
        for i, t in enumerate(texts):
            ids[i, :len(t)] = torch.tensor([1000 + ord(c) % 5000 for c in t])
        return {"input_ids": ids, "attention_mask": (ids > 0).long(), "token_type_ids": torch.zeros_like(ids)}

    r = d.bart_speed(m, arms, "dialogue_generation", ["今天天气很好", "他跑得快"], tok, 0, 2, max_new_tokens=4,
                     min_length=6, num_beams=1)
    for k in ("plain_over_sparse_generate", "trimmed_over_sparse_generate", "padded_over_trimmed_generate"):
        assert r[k] > 0 and r[f"{k}_min"] <= r[k] <= r[f"{k}_max"]
    assert r["batch"] == 2 and r["max_new_tokens"] == 4
