"""scripts/reproduce.py: the stage plan and the report's completeness check (what CI's quick run relies on).
The quick run itself is CI's last step (`make reproduce-quick`), not a test: it takes ~8 minutes."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import reproduce  # noqa: E402
from reproduce_report import Doc, build  # noqa: E402


def test_dry_run_lists_every_stage_command(tmp_path):
    r = subprocess.run([sys.executable, "scripts/reproduce.py", "--quick", "--out", str(tmp_path), "--dry-run"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for st in reproduce.STAGES:
        assert f") {st.name}:" in r.stdout
    assert "deepspeed --num_gpus 2 pretrain/run.py" in r.stdout
    assert "skillnet.finetune.compare" in r.stdout
    assert not (tmp_path / "stages" / "corpus.json").exists()  # a dry run records nothing as done


def test_problems_flag_empty_and_not_run_sections(tmp_path):
    d = Doc()
    d.h(1, "t")
    d.h(2, "filled")
    d.p("a number: 1.0")
    d.h(2, "empty")
    d.h(2, "pending")
    d.p("Not run yet (stage x).")
    d.img(tmp_path / "absent.png", "a picture")
    assert d.problems() == [f"picture missing: {tmp_path / 'absent.png'}", "section empty: empty",
                            "section not run: pending"]
    ok = Doc()
    ok.h(2, "filled")
    ok.table(["a"], [["1"]])
    assert ok.problems() == []


@pytest.mark.parametrize("part", ["nlu", "nlg", "all"])
def test_report_of_an_unfinished_run_is_incomplete(tmp_path, part):
    _, parts, names = reproduce.PARTS[part]
    stages = [s for s in reproduce.STAGES if s.name in names]
    path, problems = build(tmp_path, reproduce.PROFILES["quick"], stages, tmp_path / "r.md", "t", parts)
    assert path.is_file() and path.with_suffix(".html").is_file()
    assert any(p.startswith("section not run") for p in problems)
    assert "section not run: Where the papers' claims hold at this scale" in problems


def test_check_exits_nonzero_on_an_incomplete_report(tmp_path):
    r = subprocess.run([sys.executable, "scripts/reproduce.py", "--quick", "--out", str(tmp_path), "--stages",
                        "report", "--check", "--report", str(tmp_path / "r.md")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "error: report incomplete: section not run" in r.stderr


@pytest.mark.parametrize("name", list(reproduce.PROFILES))
def test_every_profile_writes_fine_tuning_configs_that_load(tmp_path, name):
    """The scale profile names BERT-base and BART-base presets: each must exist for its architecture."""
    from skillnet.finetune.config import FinetuneConfig

    r = reproduce.Runner(tmp_path, reproduce.PROFILES[name], dry_run=True)
    nlu = reproduce._nlu_config(r, {n: t for n, (_, _, t) in reproduce.NLU_TASKS.items()}, 10, "nlu")
    nlg = reproduce._nlg_config(r, reproduce._nlg_train_tasks(), 10, "nlg")
    for path in (nlu, nlg):  # the model config of the preset (the runs pass --init; bart_pt uses the preset)
        cfg = FinetuneConfig.load(path)
        assert cfg._model_config(str(path)) is not None


def test_bart_base_preset_has_bart_base_sizes():
    from skillnet.model import SkillNetBartConfig

    c = SkillNetBartConfig.preset("base")
    assert (c.d_model, c.encoder_layers, c.decoder_layers, c.encoder_ffn_dim, c.encoder_attention_heads) == (
        768, 6, 6, 3072, 12)


def test_flops_per_token_by_hand():
    c = {"hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 2, "vocab_size": 10}
    # per layer: 4*d^2 = 64 and k=2 FFNs of 2*d*f = 64 each -> 192 multiply-adds; scores 4*seq*d = 48 at seq 3
    assert reproduce._bert_flops_per_token(c, seq=3, k=2) == 3 * (2 * 2 * 192 + 2 * 48)
    assert reproduce._bert_flops_per_token(c, seq=3, k=2, mlm=True) == 3 * (2 * 2 * 192 + 2 * 48 + 2 * 0.15 * 40)


def test_estimate_scales_with_the_profile():
    full = {r["stage"]: r for r in reproduce.estimate(reproduce.PROFILES["full"])}
    scale = {r["stage"]: r for r in reproduce.estimate(reproduce.PROFILES["scale"])}
    assert set(full) == set(scale) == {s.name for s in reproduce.STAGES} - {"corpus", "shards", "nlu_tasks", "nlg_tasks"}
    assert all(scale[k]["pflop"] > 100 * full[k]["pflop"] > 0 for k in full)


def test_sampling_studies_run_on_unbalanced_tasks(tmp_path):
    """With equal task sizes every alpha (and T) gives the same mix: the studies cut the tasks to the papers'
    relative sizes."""
    import json

    r = reproduce.Runner(tmp_path, reproduce.PROFILES["full"], dry_run=True)
    for fn, name in ((reproduce.stage_nlu_alpha, "nlu_alpha"), (reproduce.stage_nlg_temp, "nlg_temp")):
        fn(r)
        caps = [t["max_train_examples"] for t in json.loads((tmp_path / "configs" / f"{name}.json").read_text())["tasks"]]
        assert max(caps) == (r.p.nlu_train if name == "nlu_alpha" else r.p.nlg_train)
        assert max(caps) / min(caps) > 5
    assert reproduce.paper_ratio_caps({"a": 10, "b": 40}, 400) == {"a": 100, "b": 400}
