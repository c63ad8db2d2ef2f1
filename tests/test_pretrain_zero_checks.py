"""Sparse-update semantics under ZeRO-2 with 2 ranks, and every shipped ds_configs/*.json.

One `deepspeed --num_gpus 2` launch of tests/fixtures/pretrain/zero_checks.py (see its docstring)
writes a per-rank report; the tests below read it.
"""

from __future__ import annotations

import json

import pytest

from tests.fixtures.pretrain.helpers import REPO
from tests.fixtures.warm import launch_fixture

pytestmark = pytest.mark.slow

NSP_ONLY = ("s1", "s3")  # active in NSP steps, inactive in the MLM step under test
NEVER = ("s4", "s5", "s6")  # no pre-training objective uses them
MLM = ("s2", "s7")


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("zero_checks")
    launch_fixture("tests/fixtures/pretrain/zero_checks.py", [str(out)], timeout=900)
    return [json.loads((out / f"report_rank{r}.json").read_text()) for r in (0, 1)]


def test_inactive_skills_untouched_under_zero2(reports: list[dict]) -> None:
    for rep in reports:
        sparse = rep["sparse"]["True"]
        assert sparse["objectives_seen"] == ["mlm", "nsp"]
        sk = sparse["skills"]
        for s in NSP_ONLY:
            assert sk[s]["moments_nonzero"], f"{s} should have trained in an NSP step before"
            assert sk[s]["params_unchanged"] and sk[s]["moments_unchanged"], f"{s} moved in an MLM step"
        for s in NEVER:
            assert sk[s]["params_unchanged"] and sk[s]["moments_unchanged"], s
        for s in MLM:
            assert not sk[s]["params_unchanged"] and not sk[s]["moments_unchanged"], f"{s} did not train"
    assert reports[0]["sparse"]["True"]["weights_sum"] == reports[1]["sparse"]["True"]["weights_sum"]


def test_control_dense_adamw_moves_inactive_skills_under_zero2(reports: list[dict]) -> None:
    """Without sparse updates ZeRO-2 moves skills that were not used: the problem MaskedAdamW fixes."""
    sk = reports[0]["sparse"]["False"]["skills"]
    for s in NSP_ONLY:
        assert not sk[s]["params_unchanged"] and not sk[s]["moments_unchanged"]
    for s in NEVER:
        assert not sk[s]["params_unchanged"]  # weight decay


def test_every_ds_config_is_accepted(reports: list[dict]) -> None:
    shipped = sorted(p.name for p in (REPO / "ds_configs").glob("*.json"))
    assert {
        "zero1.json",
        "zero2.json",
        "zero2_offload.json",
        "zero3.json",
        "cpu_fp32.json",
        "v100_fp16.json",
        "a100_bf16.json",
        "paper_v100x32.json",
    } <= set(shipped)
    configs = reports[0]["configs"]
    assert sorted(configs) == shipped
    for name, res in configs.items():
        assert res["ok"], f"{name}: {res.get('error')}\n{res.get('trace', '')}"
        fp32 = not any(k in name for k in ("fp16", "bf16", "v100"))
        assert res["mode"] == ("initialize+step" if fp32 else "schema"), name


def test_fp16_configs_run_dynamic_loss_scaling_as_written(reports: list[dict]) -> None:
    """fp16 cannot run on this CPU: what can be checked is that DeepSpeed reads each fp16 JSON's loss scaler
    as written (dynamic scaling: loss_scale 0) and would skip overflowed steps with it."""
    configs = reports[0]["configs"]
    fp16 = [n for n in configs if json.loads((REPO / "ds_configs" / n).read_text()).get("fp16", {}).get("enabled")]
    assert {"v100_fp16.json", "paper_v100x32.json"} <= set(fp16)
    for name in fp16:
        written = json.loads((REPO / "ds_configs" / name).read_text())["fp16"]
        parsed = configs[name]["fp16"]
        assert parsed["loss_scale"] == 0, f"{name}: static loss scaling"
        for key, value in parsed.items():
            assert value == written.get(key, value), f"{name}: {key} parsed as {value}, written {written[key]}"
        assert parsed["min_loss_scale"] >= 1 and parsed["hysteresis"] >= 1
