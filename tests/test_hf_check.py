"""experiments.hf_check runs plain transformers in a temporary folder: a model folder given relative to
the caller's working directory must still be found there (it was read as a hub repo id)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from skillnet.experiments.hf_check import run_plain


@pytest.mark.slow  # 6-12 s (subprocesses): among the slowest, kept out of make test-fast (3 min)
def test_a_relative_folder_reaches_the_plain_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text("{}", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    res = run_plain(sys.executable, Path("export"), {}, "import os\nres['found'] = os.path.isfile(os.path.join(folder, 'config.json'))")
    assert res == {"found": True}
    assert os.getcwd() == str(tmp_path)
