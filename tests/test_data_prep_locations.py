"""data_prep's bad-input reports name the real line (and column) of each item.

Before: JSONL lines missing the text field were all reported at the first line of their 1 MB chunk
(`f.jsonl:1 (chunk)`), and empty documents `near byte 0`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from skillnet.data_prep import corpus
from skillnet.data_prep.build import BuildConfig, build

FIX = Path(__file__).parent / "fixtures" / "data_prep"
REPO = Path(__file__).resolve().parents[1]


def _report(inputs: list[Path], out: Path, **kw) -> dict:
    return build(BuildConfig(inputs=[str(p) for p in inputs], out=str(out), progress=False, **kw))[
        "bad_input"
    ]


def _lines(examples: list[str], name: str) -> list[str]:
    """'…/f.jsonl:3: no string field' -> '3'; '…/f.jsonl:2:19' -> '2:19'."""
    out = []
    for e in examples:
        m = re.search(re.escape(name) + r":(\d+(?::\d+)?)(?::|$)", e)
        assert m, f"no line in {e!r}"
        out.append(m.group(1))
    return out


def test_missing_text_field_names_each_line(tmp_path: Path) -> None:
    """Lines 3, 4 and 7 lack a string "text" (whole chunk parsed at once: the fast path)."""
    rep = _report([FIX / "missing_text.jsonl"], tmp_path / "o")
    assert rep["counts"] == {"missing_text_field": 3}
    assert _lines(rep["examples"]["missing_text_field"], "missing_text.jsonl") == ["3", "4", "7"]
    assert all(
        "no string field 'text'" in e and "(chunk)" not in e for e in rep["examples"]["missing_text_field"]
    )


def test_bad_json_line_and_column_and_missing_fields_after_it(tmp_path: Path) -> None:
    """A bad line forces the per-line path: the lines after it keep their numbers."""
    f = FIX / "missing_text_bad_json.jsonl"
    rep = _report([f], tmp_path / "o")
    assert rep["counts"] == {"bad_json": 1, "missing_text_field": 3}
    bad = f.read_text(encoding="utf-8").splitlines()[1]
    with pytest.raises(json.JSONDecodeError) as e:
        json.loads(bad)
    assert _lines(rep["examples"]["bad_json"], f.name) == [f"2:{e.value.colno}"]
    assert _lines(rep["examples"]["missing_text_field"], f.name) == ["3", "4", "7"]


def test_empty_documents_name_their_lines(tmp_path: Path) -> None:
    """Lines 1-4 blank (space, tab, U+3000), line 7 empty, line 9 only U+200B (no tokens)."""
    f = FIX / "empty_lines.txt"
    rep = _report([f], tmp_path / "o")
    assert rep["counts"] == {"empty_document": 6}
    assert _lines(rep["examples"]["empty_document"], f.name) == ["1", "2", "3"]
    assert not any("near byte" in e for e in rep["examples"]["empty_document"])
    # Lines 7 and 9 are reported too once lines 1-4 are gone; line 9 only shows after tokenising.
    tail = tmp_path / "tail.txt"
    tail.write_text("".join(f.read_text(encoding="utf-8").splitlines(keepends=True)[4:]), encoding="utf-8")
    rep = _report([tail], tmp_path / "t")
    assert _lines(rep["examples"]["empty_document"], "tail.txt") == ["3", "5"]  # = lines 7 and 9 of f


def test_empty_jsonl_texts_and_blank_lines_name_their_lines(tmp_path: Path) -> None:
    f = FIX / "empty_text.jsonl"
    rep = _report([f], tmp_path / "o")
    assert rep["counts"] == {"empty_document": 3}
    assert sorted(_lines(rep["examples"]["empty_document"], f.name), key=int) == ["2", "3", "5"]


@pytest.mark.parametrize("block", [64, 4096])
@pytest.mark.parametrize("unit_bytes", [300, 1 << 20])
def test_locations_hold_across_chunks_and_byte_range_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block: int, unit_bytes: int
) -> None:
    """Many small read blocks and byte-range units: every location is still the file's own line."""
    monkeypatch.setattr(corpus, "BLOCK_BYTES", block)
    rows, missing, empty = [], [], []
    for i in range(1, 121):
        if i % 17 == 0:
            rows.append('{"other": "没有"}')
            missing.append(str(i))
        elif i % 23 == 0:
            rows.append('{"text": " "}')
            empty.append(str(i))
        else:
            rows.append(json.dumps({"text": f"第{i}行。"}, ensure_ascii=False))
    f = tmp_path / "many.jsonl"
    f.write_text("\n".join(rows) + "\n", encoding="utf-8")
    rep = _report([f], tmp_path / "o", unit_bytes=unit_bytes)
    assert rep["counts"] == {"missing_text_field": len(missing), "empty_document": len(empty)}
    assert _lines(rep["examples"]["missing_text_field"], f.name) == missing[:3]
    assert _lines(rep["examples"]["empty_document"], f.name) == empty[:3]
    text = tmp_path / "many.txt"  # the same in one-document-per-line text
    text.write_text("\n".join("" if str(i) in empty else f"第{i}行。" for i in range(1, 121)) + "\n")
    rep = _report([text], tmp_path / "t", unit_bytes=unit_bytes)
    assert _lines(rep["examples"]["empty_document"], text.name) == empty[:3]


def test_compressed_inputs_report_lines_too(tmp_path: Path) -> None:
    import gzip

    f = tmp_path / "m.jsonl.gz"
    f.write_bytes(gzip.compress((FIX / "missing_text.jsonl").read_bytes()))
    rep = _report([f], tmp_path / "o")
    assert _lines(rep["examples"]["missing_text_field"], f.name) == ["3", "4", "7"]


@pytest.mark.slow  # 6-12 s (subprocesses): among the slowest, kept out of make test-fast (3 min)
def test_strict_stops_at_the_first_bad_line(tmp_path: Path) -> None:
    for name, where in (("missing_text.jsonl", ":3"), ("empty_lines.txt", ":1"), ("empty_text.jsonl", ":2")):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "skillnet.data_prep",
                "build",
                str(FIX / name),
                "--out",
                str(tmp_path / name),
            ]
            + ["--strict", "--no-progress"],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert r.returncode == 2, r.stderr
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and f"{name}{where}:" in err[0], err
