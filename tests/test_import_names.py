"""The library's import path is `skillnet.<folder>`: a user's own `model.py`, `training/` or `finetune.py`
in the working directory cannot shadow it (issue: safe import names)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.pretrain.helpers import subprocess_env

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # measured 21 s
def test_user_modules_named_like_the_folders_do_not_shadow_the_library(tmp_path):
    for name in ("model", "training", "finetune", "data_prep", "pretrain", "export"):
        (tmp_path / f"{name}.py").write_text(f"raise SystemExit('the user\\'s {name}.py was imported')\n")
    code = ("import skillnet.finetune.run, skillnet.pretrain.run, skillnet.pretrain.export, skillnet.data_prep.__main__; "
            "from skillnet.model import SkillNetBertConfig; print(SkillNetBertConfig.model_type)")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env=subprocess_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "skillnet-bert"
    # The console entry point too, run from that directory.
    r = subprocess.run([sys.executable, "-m", "skillnet.finetune.run", "--help"], cwd=tmp_path,
                       capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert r.returncode == 0 and "--config" in r.stdout, r.stderr[-2000:]


@pytest.mark.slow  # 6-12 s (subprocesses): among the slowest, kept out of make test-fast (3 min)
def test_a_checkout_imports_what_a_wheel_holds():
    """Run from the repository root (the root on sys.path, as in any checkout): the library's folders resolve
    only through the package-dir mapping, so the files a wheel leaves out are not `skillnet.*` and each file
    has one module name."""
    code = (
        "import importlib, sys, skillnet, skillnet.model.config, skillnet.finetune.run\n"
        "assert len(skillnet.__path__) == 1, skillnet.__path__\n"
        "assert not {m for m in sys.modules if m.split('.')[0] in ('model', 'training', 'finetune')}\n"
        "for name in ('skillnet.bench', 'skillnet.tests', 'skillnet.scripts'):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError:\n"
        "        continue\n"
        "    raise SystemExit(name + ' resolves in a checkout but is not in the wheel')\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       env=subprocess_env(), timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout[-2000:] + r.stderr[-2000:]


def test_lint_bans_bare_folder_imports():
    """ruff's banned-api rule (pyproject.toml) forbids `model.`/`training.`/... imports, which would load a file
    a second time under another name. It fires on absolute imports inside and outside the library, lets the
    library's relative imports through, and the project passes it."""
    probe = ("import model.config\nfrom training.trainer import Trainer\nimport finetune.run\n"
             "from data_prep.tasks import schema\nfrom pretrain import run\nfrom .config import X\n")
    for where in ("model/_probe.py", "bench/_probe.py", "tests/_probe.py"):
        r = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "TID251", "--output-format",
                            "concise", "--stdin-filename", where, "-"], input=probe, cwd=REPO,
                           capture_output=True, text=True, timeout=120)
        flagged = sorted(line.split("`")[1] for line in r.stdout.splitlines() if "TID251" in line)
        assert flagged == ["data_prep", "finetune", "model", "pretrain", "training"], (where, r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--select", "TID251", "."], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
