"""Loading a checkpoint runs no code the user did not ask for (issue 58).

Real checkpoints are written by the current code (pre-training plain and under DeepSpeed ZeRO-2/3, one rank;
fine-tuning plain), then one object whose unpickling would create a marker file is planted in each kind of
file: the trainer state, DeepSpeed's model states, its optimizer partition, ``plain.pt``. Export, pre-training
resume, fine-tuning resume and the reshard (the universal conversion) refuse it in one line naming the file,
and the marker never appears; ``--trust-checkpoint`` loads it and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from skillnet.common import safe_load
from skillnet.common.safe_load import ALLOWED_GLOBALS, UntrustedCheckpointError

from tests.fixtures.pretrain.helpers import REPO, subprocess_env

pytestmark = pytest.mark.slow
TAG = "step_00000002"


class Plant:
    """Unpickling it runs a shell command that creates `marker` (what a hostile checkpoint would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def _pretrain(out: Path, *extra: str, steps: int = 2) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in subprocess_env().items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    return subprocess.run(
        [sys.executable, str(REPO / "pretrain" / "run.py"), "--synthetic", "64", "--preset", "tiny", "--max-steps",
         str(steps), "--output-dir", str(out), "--no-progress", "--no-tensorboard", "--save-every", "2", *extra],
        capture_output=True, text=True, timeout=600, env=env, cwd=out.parent)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Pre-training runs of the current code, 2 steps each: plain PyTorch, ZeRO-2 and ZeRO-3 (one rank)."""
    base = tmp_path_factory.mktemp("safe_load")
    out = {}
    for kind, extra in {"plain": (), "zero2": ("--ds-config", str(REPO / "ds_configs" / "cpu_fp32.json")),
                        "zero3": ("--ds-config", str(REPO / "ds_configs" / "zero3.json"))}.items():
        r = _pretrain(base / kind, *extra)
        assert r.returncode == 0, r.stderr[-3000:]
        out[kind] = base / kind
    return out


def _copy_with_plant(run: Path, dest: Path, file: str) -> Path:
    """A copy of `run` whose checkpoint file `file` also holds a `Plant`; returns the marker's path."""
    shutil.copytree(run, dest)
    marker = dest.parent / f"{dest.name}.ran"
    f = dest / "checkpoints" / TAG / file
    state = torch.load(f, map_location="cpu", weights_only=False)  # our own file, written above
    state["planted"] = Plant(marker)
    torch.save(state, f)
    return marker


def _one_refusal(stderr: str, file: str) -> None:
    lines = [ln for ln in stderr.splitlines() if "refused to load" in ln]
    assert len(lines) == 1 and file in lines[0] and "posix.system" in lines[0], stderr[-3000:]
    assert "--trust-checkpoint" in lines[0] and "Traceback" not in stderr, stderr[-3000:]


def test_every_file_the_current_code_writes_loads_weights_only(runs: dict[str, Path], tmp_path: Path) -> None:
    files = sorted(f for run in runs.values() for f in (run / "checkpoints" / TAG).glob("*.pt"))
    assert {f.name for f in files} >= {"trainer_rank0.pt", "plain.pt", "mp_rank_00_model_states.pt",
                                        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                        "zero_pp_rank_0_mp_rank_00_model_states.pt"}
    for f in files:
        assert set(torch.serialization.get_unsafe_globals_in_checkpoint(f)) <= ALLOWED_GLOBALS, f
        full = torch.load(f, map_location="cpu", weights_only=False)
        safe = safe_load.load(f, trust=False)
        assert safe.keys() == full.keys(), f
    state = safe_load.load(runs["plain"] / "checkpoints" / TAG / "trainer_rank0.pt", trust=False)
    assert state["step"] == 2 and state["rng"]["numpy"][1].dtype.name == "uint32"


def test_a_planted_pickle_is_refused_by_the_loader_and_runs_only_when_trusted(tmp_path: Path) -> None:
    f, marker = tmp_path / "x.pt", tmp_path / "ran"
    torch.save({"w": torch.ones(2), "p": Plant(marker)}, f)
    with pytest.raises(UntrustedCheckpointError, match=r"x\.pt: refused to load: it needs posix\.system"):
        safe_load.load(f, trust=False)
    with pytest.raises(UntrustedCheckpointError), safe_load.guard_torch_load(trust=False):
        torch.load(f, weights_only=False)  # as DeepSpeed asks for it
    assert not marker.exists()
    assert safe_load.load(f, trust=True)["w"].sum() == 2 and marker.exists()


@pytest.mark.parametrize(("kind", "file"), [
    ("plain", "trainer_rank0.pt"), ("plain", "plain.pt"), ("zero2", "mp_rank_00_model_states.pt"),
    ("zero2", "zero_pp_rank_0_mp_rank_00_optim_states.pt"), ("zero3", "zero_pp_rank_0_mp_rank_00_model_states.pt")])
def test_export_refuses_a_planted_file_and_trusts_it_on_purpose(runs: dict[str, Path], tmp_path: Path, kind: str,
                                                                 file: str) -> None:
    marker = _copy_with_plant(runs[kind], tmp_path / "run", file)
    cmd = [sys.executable, "-m", "skillnet.pretrain.export", "--checkpoint", str(tmp_path / "run"), "--out"]
    r = subprocess.run([*cmd, str(tmp_path / "hf")], capture_output=True, text=True, timeout=600, env=subprocess_env())
    assert r.returncode == 2 and not marker.exists() and not (tmp_path / "hf").exists()
    _one_refusal(r.stderr, f"{TAG}/{file}")
    r = subprocess.run([*cmd, str(tmp_path / "hf"), "--trust-checkpoint"], capture_output=True, text=True,
                       timeout=600, env=subprocess_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert marker.exists() and (tmp_path / "hf" / "config.json").is_file()
    assert f"{file}: loading it with --trust-checkpoint" in r.stderr


@pytest.mark.parametrize(("kind", "file"), [
    ("plain", "trainer_rank0.pt"), ("plain", "plain.pt"), ("zero2", "mp_rank_00_model_states.pt"),
    ("zero2", "zero_pp_rank_0_mp_rank_00_optim_states.pt")])
def test_pretraining_resume_refuses_a_planted_file(runs: dict[str, Path], tmp_path: Path, kind: str, file: str) -> None:
    marker = _copy_with_plant(runs[kind], tmp_path / "run", file)
    ds = ("--ds-config", str(REPO / "ds_configs" / "cpu_fp32.json")) if kind != "plain" else ()
    r = _pretrain(tmp_path / "run", *ds, steps=3)
    assert r.returncode == 2 and not marker.exists(), r.stderr[-3000:]
    _one_refusal(r.stderr, f"{TAG}/{file}")
    assert not (tmp_path / "run" / "checkpoints" / "step_00000003").exists()
    if file == "zero_pp_rank_0_mp_rank_00_optim_states.pt":  # the one read inside DeepSpeed's engine
        r = _pretrain(tmp_path / "run", *ds, "--trust-checkpoint", "--new-schedule", steps=3)
        assert r.returncode == 0 and marker.exists(), r.stderr[-3000:]
        assert f"{file}: loading it with --trust-checkpoint" in r.stderr
        assert (tmp_path / "run" / "checkpoints" / "step_00000003" / "complete").is_file()


def test_the_reshard_conversion_refuses_a_planted_optimizer_partition(runs: dict[str, Path], tmp_path: Path) -> None:
    from skillnet.training.reshard import ensure_universal

    marker = _copy_with_plant(runs["zero2"], tmp_path / "run", "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    tdir = tmp_path / "run" / "checkpoints" / TAG
    with pytest.raises(RuntimeError, match=r"universal conversion .* failed on rank 0: UntrustedCheckpointError: .*"
                                           r"optim_states\.pt: refused to load"):
        ensure_universal(tdir, 0)
    assert not marker.exists() and not (tdir.parent / "universal" / TAG).exists()
    safe_load.trust_checkpoints(True)
    try:
        assert (ensure_universal(tdir, 0) / "complete").is_file() and marker.exists()
    finally:
        safe_load.trust_checkpoints(False)


def test_finetuning_resume_refuses_a_planted_file(tmp_path: Path) -> None:
    from skillnet.finetune.cli import main

    from tests.test_finetune_e2e import tiny_config

    cfg = tiny_config(tmp_path / "ft")
    cfg["train"].update(max_steps=2, save_every=2, eval_every=0)
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert main(["--config", str(tmp_path / "c.json"), "--no-progress", "--no-tensorboard"]) == 0
    for file in ("trainer_rank0.pt", "plain.pt"):
        shutil.rmtree(tmp_path / "run", ignore_errors=True)
        marker = _copy_with_plant(tmp_path / "ft", tmp_path / "run", file)
        (tmp_path / "run" / "results.json").unlink(missing_ok=True)  # unfinished: it resumes
        cfg["output_dir"] = str(tmp_path / "run")
        (tmp_path / "c.json").write_text(json.dumps(cfg))
        r = subprocess.run([sys.executable, "-m", "skillnet.finetune.run", "--config", str(tmp_path / "c.json"),
                            "--resume", "auto", "--no-progress", "--no-tensorboard"],
                           capture_output=True, text=True, timeout=600, env=subprocess_env())
        assert r.returncode == 2 and not marker.exists(), r.stderr[-3000:]
        _one_refusal(r.stderr, f"{TAG}/{file}")
    r = subprocess.run([sys.executable, "-m", "skillnet.finetune.run", "--config", str(tmp_path / "c.json"),
                        "--resume", "auto", "--no-progress", "--no-tensorboard", "--trust-checkpoint"],
                       capture_output=True, text=True, timeout=600, env=subprocess_env())
    assert r.returncode == 0 and marker.exists(), r.stderr[-3000:]
    assert "plain.pt: loading it with --trust-checkpoint" in r.stderr


def test_the_export_tokenizer_loads_without_remote_code_or_a_prompt(runs: dict[str, Path], tmp_path: Path) -> None:
    """docs/hf.md's tokenizer lines, in a fresh interpreter without SkillNet and with stdin closed."""
    from skillnet.export.hf_folder import export

    hf = export(runs["plain"], tmp_path / "hf")
    code = ("import sys; from transformers import AutoTokenizer, BertTokenizer\n"
            "a = BertTokenizer.from_pretrained(sys.argv[1])\n"
            "b = AutoTokenizer.from_pretrained(sys.argv[1], tokenizer_type='bert')\n"
            "assert 'skillnet' not in sys.modules\n"
            "print(a('北京')['input_ids'], b('北京')['input_ids'], a.model_max_length)")
    r = subprocess.run([sys.executable, "-c", code, str(hf)], capture_output=True, text=True, timeout=300,
                       stdin=subprocess.DEVNULL, env=subprocess_env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[-2] == "[101, 1266, 776, 102] [101, 1266, 776, 102] 512"
    assert "custom code" not in r.stdout + r.stderr
