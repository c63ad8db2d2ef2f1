"""bench/generate.py: the dense twin has the activated FFN width of k skills, and the script prints its
JSON keys last (no timing assertions)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_generate", REPO / "bench" / "generate.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_dense_twin_widens_exactly_the_skill_layers() -> None:
    from skillnet.model import skillnet_bart_from_dense
    from transformers import BartConfig, BartForConditionalGeneration

    bench = _bench_module()
    dense = BartForConditionalGeneration(BartConfig(**{**bench.SIZES["tiny"], "encoder_layers": 3,
                                                       "decoder_layers": 3, "decoder_ffn_dim": 48}))
    cfg = skillnet_bart_from_dense(dense).config
    for k in (1, 3):
        twin = bench.dense_twin(dense, cfg, k)
        for stack, skill_ids, f in ((twin.model.encoder, cfg.encoder_skill_layer_ids(), 64),
                                    (twin.model.decoder, cfg.decoder_skill_layer_ids(), 48)):
            widths = [(layer.fc1.out_features, layer.fc2.in_features) for layer in stack.layers]
            want = [(k * f, k * f) if i in skill_ids else (f, f) for i in range(3)]
            assert widths == want, (k, widths)
        assert skill_ids == [0, 2]  # every other layer: the twin really has layers of both kinds
    assert all(lay.fc1.out_features == 64 for lay in dense.model.encoder.layers)  # the original is untouched
    twin = bench.dense_twin(dense, cfg, 2)
    out = twin(input_ids=torch.tensor([[104, 105, 106]]), labels=torch.tensor([[104, 105]]))
    assert out.logits.shape == (1, 2, cfg.vocab_size)


def test_skill_choice_uses_a_task_when_one_has_k_skills() -> None:
    from skillnet.model import SkillNetBartConfig

    bench = _bench_module()
    cfg = SkillNetBartConfig.preset("tiny")
    for k in (2, 3, 4):
        label, choice = bench.skill_choice(cfg, k)
        assert len(cfg.skill_ids(choice["task"])) == k and label == choice["task"]
    label, choice = bench.skill_choice(cfg, 1)  # no task has one skill: the generic skill alone
    assert choice == {"skill_ids": [cfg.skill_index("general")]}
    label, choice = bench.skill_choice(cfg, 5)
    assert len(choice["skill_ids"]) == 5 and cfg.skill_index("general") in choice["skill_ids"]
    with pytest.raises(SystemExit, match="k=9 is outside"):
        bench.skill_choice(cfg, 9)


@pytest.mark.slow
def test_bench_prints_the_issue_keys_as_last_line() -> None:
    cmd = [sys.executable, "bench/generate.py", "--sizes", "tiny", "--ks", "1,2", "--batch", "2",
           "--src_len", "8", "--new_tokens", "3", "--tgt_len", "4", "--reps", "1", "--warmup", "0", "--json"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("generate_over_dense", "train_over_dense", "generate_over_dense_min", "train_over_dense_min",
                "train_packed_over_dense"):
        assert isinstance(res[key], float) and res[key] > 0, key
    assert [row["k"] for row in res["rows"]] == [1, 2]
    for row in res["rows"]:
        for key in ("gen_skill_tok_s", "gen_dense_tok_s", "train_skill_tok_s", "train_dense_tok_s"):
            assert row[key] > 0, key
    assert res["generate_over_dense"] == min(row["generate_over_dense"] for row in res["rows"])
    assert "generate_over_dense" in r.stdout.splitlines()[-2]  # the readable summary precedes the JSON


@pytest.mark.slow  # 6-12 s (subprocesses): among the slowest, kept out of make test-fast (3 min)
def test_bench_rejects_bad_options_with_one_line() -> None:
    r = subprocess.run([sys.executable, "bench/generate.py", "--sizes", "huge"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "error: --sizes: unknown huge" in r.stderr
    assert "Traceback" not in r.stderr
