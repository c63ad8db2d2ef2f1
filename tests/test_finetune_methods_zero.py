"""Every method under the 2-rank ZeRO-2 launch trains exactly like one plain process, and what a step
did not use (the other task's head and PALs, unused skills or experts) stays bit-identical through it.

ZeRO-2 zero-fills the gradients of parameters a step did not touch and steps whole partitions; the
plain run skips `None` gradients. Equal weights after the step, and equal sets of unchanged tensors,
show that the sparse-update mechanism holds for each method's own parts (gates, maps, PALs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.fixtures.warm import launch_fixture

pytestmark = pytest.mark.slow
FIX = Path(__file__).resolve().parent / "fixtures" / "finetune"
RUNS = "tests/fixtures/finetune/runs.py"


def _config(tmp: Path, method: str) -> Path:
    def task(name: str, skills: list[str]) -> dict:
        return {"name": name, "type": "classification", "skills": skills, "max_seq_len": 24,
                "train": str(FIX / "sent_train.jsonl"), "dev": str(FIX / "sent_dev.jsonl")}

    cfg = {
        "method": method,
        # no dropout: the two runs must be comparable number for number. MoE: the balancing loss and the
        # capacity are functions of each rank's own tokens (as in fairseq), so 2 ranks x 4 rows cannot
        # equal 1 x 8 rows with them on; they are tested on one process in tests/test_model_moe.py.
        "model": {"preset": "tiny", "overrides": {
            "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
            **({"moe_aux_loss_coef": 0.0, "moe_capacity_factor": 100.0} if method == "moe" else {})}},
        "tasks": [task("sent_a", ["s1", "s4", "s7"]), task("sent_b", ["s2", "s3", "s7"])],
        # step 1 trains sent_a only: sent_b's parts must not move
        "sampler": {"kind": "round_robin", "order": ["sent_a", "sent_b"]},
        "train": {"max_steps": 1, "batch_size": 8, "lr": 5e-3, "warmup_ratio": 0.0, "eval_every": 0,
                  "log_every": 1, "seed": 3, "skill_map_lr": 5e-2},
    }
    p = tmp / f"{method}.json"
    p.write_text(json.dumps(cfg, ensure_ascii=False), encoding="utf-8")
    return p


def _initial_state(cfg_path: Path) -> dict[str, torch.Tensor]:
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.finetune import run as run_cli
    from skillnet.finetune.build import build_model
    from skillnet.finetune.config import FinetuneConfig

    cfg = FinetuneConfig.load(cfg_path)
    model, _ = build_model(cfg, run_cli.load_task_data(cfg, load_tokenizer(None)))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _export(run: Path, method: str) -> dict[str, torch.Tensor]:
    sub = run / "sent_a" if method == "task_specific" else run
    return load_file(str(sub / "export" / "model.safetensors"))


METHODS = ["dense_joint", "task_specific", "moe", "learnable", "pals"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    """Every method once in one plain process and once in one 2-rank ZeRO-2 launch (the CLI entry in-process,
    tests/fixtures/finetune/runs.py): the interpreter and launcher start once, not once per method."""
    tmp = tmp_path_factory.mktemp("methods_zero")
    cfgs = {m: _config(tmp, m) for m in METHODS}
    launch_fixture(RUNS, [str(tmp / "plain"), *map(str, cfgs.values())], nprocs=0, timeout=900)
    launch_fixture(RUNS, [str(tmp / "zero"), "--ds_config", "ds_configs/cpu_fp32.json", *map(str, cfgs.values())],
                   timeout=900)
    return tmp, cfgs


@pytest.mark.parametrize("method", METHODS)
def test_method_under_zero2_matches_plain_and_keeps_unused_parts(runs, method):
    tmp, cfgs = runs
    cfg = cfgs[method]
    plain, zero = tmp / "plain" / method, tmp / "zero" / method
    assert json.loads((zero / "results.json").read_text())["world_size"] == 2
    a, b = _export(plain, method), _export(zero, method)
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=f"{method}: ZeRO-2 differs at {k}")
    if method == "task_specific":
        return  # each task model trains alone: nothing of another task is in it
    init = _initial_state(cfg)
    assert set(init) == set(a)
    still_plain = {k for k in a if torch.equal(a[k], init[k])}
    still_zero = {k for k in b if torch.equal(b[k], init[k])}
    assert still_plain == still_zero, f"{method}: unchanged sets differ: {sorted(still_plain ^ still_zero)[:6]}"
    other = [k for k in init if k.startswith("heads.sent_b.") or ".sent_b." in k]
    assert other and set(other) <= still_zero, f"{method}: sent_b's parts moved in a sent_a step"
    if method == "pals":
        assert any(".sent_b." in k for k in other), "no PAL parameters of sent_b found"
    mine = [k for k in init if k.startswith("heads.sent_a.")]
    assert mine and not set(mine) <= still_zero, f"{method}: sent_a's head did not train"
