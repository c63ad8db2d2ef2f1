"""SkillNet-BART sparse updates under the 2-rank ZeRO-2 launch: a step of one task
leaves the skills it did not use bit-identical, and moves the ones it used.

One `deepspeed --num_gpus 2` launch of tests/fixtures/bart_zero/sparse_step.py (see its docstring) writes
the weights before and after one step of the real Trainer; the tests below read them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.fixtures.warm import launch_fixture

pytestmark = pytest.mark.slow

# Task A = text_summarization: non_open_end (1) + general (5); the other four skills are unused.
USED, UNUSED = (1, 5), (0, 2, 3, 4)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("bart_zero")
    launch_fixture("tests/fixtures/bart_zero/sparse_step.py", [str(out)], timeout=900)
    res: dict[str, dict] = {}
    for name in ("sparse", "dense", "moe"):
        res[name] = {"init": torch.load(out / f"{name}_init.pt"),
                     "ranks": [torch.load(Path(out) / f"{name}_rank{r}.pt") for r in (0, 1)]}
    return res


def _skill_keys(params: dict[str, torch.Tensor], skill: int) -> list[str]:
    return [k for k in params if f".skill_ffn.skills.{skill}." in k]


def test_a_task_step_leaves_unused_skills_bit_identical_under_zero2(runs: dict[str, dict]) -> None:
    init = runs["sparse"]["init"]
    for rep in runs["sparse"]["ranks"]:
        assert rep["world_size"] == 2 and torch.isfinite(torch.tensor(rep["loss"]))
        for view in ("master", "module"):  # the fp32 partitions and the module's weights
            w = rep[view]
            for s in UNUSED:
                keys = _skill_keys(w, s)
                assert len(keys) == 2 * 4  # encoder and decoder layer 0: fc1/fc2 weight and bias
                assert all(torch.equal(w[k], init[k]) for k in keys), f"unused skill {s} moved ({view})"
                assert all(not rep["exp_avg"][k].any() for k in keys), f"unused skill {s} has Adam moments"
            for s in USED:
                keys = _skill_keys(w, s)
                assert any(not torch.equal(w[k], init[k]) for k in keys), f"used skill {s} did not move ({view})"
                assert all(rep["exp_avg"][k].any() for k in keys)
            # the rest of the model (attention, embeddings, dense layers) trained as well
            assert not torch.equal(w["model.shared.weight"], init["model.shared.weight"])
    a, b = (r["module"] for r in runs["sparse"]["ranks"])
    assert all(torch.equal(a[k], b[k]) for k in a), "the ranks disagree after the step"


def test_control_dense_adamw_moves_unused_skills_under_zero2(runs: dict[str, dict]) -> None:
    """Without sparse updates, ZeRO-2 zero-fills the unused skills' gradients and weight decay moves them:
    the failure the test above would catch."""
    init, w = runs["dense"]["init"], runs["dense"]["ranks"][0]["master"]
    for s in UNUSED:
        assert any(not torch.equal(w[k], init[k]) for k in _skill_keys(w, s)), s


def test_moe_bart_trains_under_zero2(runs: dict[str, dict]) -> None:
    """Each rank routes its own tokens, yet both ranks' graphs hold every expert: the step completes,
    the ranks agree, and every layer's gate learns."""
    init = runs["moe"]["init"]
    reps = runs["moe"]["ranks"]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in reps)
    gates = [k for k in init if k.endswith(".skill_ffn.gate.weight")]
    assert len(gates) == 2
    for k in gates:
        assert not torch.equal(reps[0]["master"][k], init[k]), k
    assert all(torch.equal(reps[0]["module"][k], reps[1]["module"][k]) for k in init)
