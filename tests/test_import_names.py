"""The library's import path is `skillnet.<folder>`: a user's own `model.py`, `training/` or `finetune.py`
in the working directory cannot shadow it (issue: safe import names)."""

from __future__ import annotations

import subprocess
import sys

from tests.fixtures.pretrain.helpers import subprocess_env


def test_user_modules_named_like_the_folders_do_not_shadow_the_library(tmp_path):
    for name in ("model", "training", "finetune", "data_prep", "pretrain"):
        (tmp_path / f"{name}.py").write_text(f"raise SystemExit('the user\\'s {name}.py was imported')\n")
    code = ("import skillnet.finetune.run, skillnet.pretrain.run, skillnet.data_prep.__main__; "
            "from skillnet.model import SkillNetBertConfig; print(SkillNetBertConfig.model_type)")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env=subprocess_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "skillnet-bert"
    # The console entry point too, run from that directory.
    r = subprocess.run([sys.executable, "-m", "skillnet.finetune.run", "--help"], cwd=tmp_path,
                       capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert r.returncode == 0 and "--config" in r.stdout, r.stderr[-2000:]


def test_library_code_imports_only_the_skillnet_path():
    """No module of the library imports a bare top-level `model`/`training`/... (which a user file could
    shadow); checked on the source so that a new import is caught at once."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    bad = []
    pat = re.compile(r"^\s*(from|import)\s+(model|training|finetune|data_prep|pretrain)\b", re.M)
    for folder in ("model", "training", "finetune", "data_prep", "pretrain", "bench", "tests"):
        for f in (root / folder).rglob("*.py"):
            for m in pat.finditer(f.read_text(encoding="utf-8")):
                bad.append(f"{f.relative_to(root)}: {m.group(0).strip()}")
    assert not bad, bad
