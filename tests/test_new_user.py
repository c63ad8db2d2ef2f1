"""A new user's job has no silent failure: a busy port and a vocabulary that does not fit the text each get one
line that says what to do, within seconds, and a killed op build's lock does not block the next launch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _env(**kw: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **kw}


def test_a_busy_master_port_is_one_line_before_training(tmp_path: Path) -> None:
    with socket.socket() as busy:  # another job's rendezvous on this node
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        t0 = time.time()
        r = subprocess.run(
            [sys.executable, str(REPO / "pretrain" / "run.py"), "--synthetic", "100", "--preset", "tiny",
             "--max-steps", "1", "--output-dir", str(tmp_path / "pt"), "--no-progress"],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env=_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"port {port} is in use (another job on this node?): add --master_port N" in r.stderr
    assert "Traceback" not in r.stderr and time.time() - t0 < 60


def test_op_builds_live_per_environment_and_a_dead_builds_lock_does_not_block(tmp_path: Path, monkeypatch) -> None:
    from skillnet.training import dist as D
    from torch.utils import cpp_extension

    # prepare_extensions sets TORCH_EXTENSIONS_DIR in os.environ: recorded here first so that the teardown
    # removes it again
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "unset-by-teardown")
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    d = D.prepare_extensions()
    assert os.environ["TORCH_EXTENSIONS_DIR"] == str(d) and d.is_relative_to(tmp_path)
    assert d.name.startswith(f"py{sys.version_info[0]}{sys.version_info[1]}-")  # this interpreter's own folder
    # every op built from here on takes a lock that a killed build cannot leave blocking (tests/test_op_build_lock.py)
    assert cpp_extension.FileBaton.__name__ == "OwnedBaton"


PROSE = ("the parser reads each argument from the command line and returns a namespace whose attributes hold the "
         "values that were given, converted to their declared types")


def test_english_text_with_the_default_vocab_warns(tmp_path: Path) -> None:
    words = PROSE.split()
    lines = [" ".join(words[i % 7 :] + words[: i % 7]) + "." for i in range(300)]
    (tmp_path / "en.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "skillnet.data_prep", "build", "en.txt", "--no-progress"]
    r = subprocess.run([*cmd, "--out", "o"], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_env())
    assert r.returncode == 0 and "warning: the vocab vocab.txt (21,128 entries) cuts the words" in r.stderr
    assert "train-tokenizer" in r.stderr and "per word on a sample" in r.stdout  # the report names the vocab
    r = subprocess.run([*cmd, "--out", "s", "--strict"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=_env())
    assert r.returncode == 2 and r.stderr.startswith("error: the vocab") and not (tmp_path / "s").exists()


def test_the_skills_are_listed_where_a_user_looks() -> None:
    from skillnet.finetune.cli import skills_table

    r = subprocess.run([sys.executable, "-m", "skillnet.finetune.run", "--list-skills"], capture_output=True, text=True,
                       timeout=60, env=_env())
    assert r.returncode == 0 and "s4  understand the sentiment of texts" in r.stdout and "--new-skill" in r.stdout
    doc = (REPO / "docs" / "finetune.md").read_text(encoding="utf-8")
    assert skills_table(markdown=True) in doc  # the doc's table is the code's
    r = subprocess.run([sys.executable, "-m", "skillnet.finetune.run", "--help"], capture_output=True, text=True,
                       timeout=60, env=_env())
    assert "--list-skills" in r.stdout
