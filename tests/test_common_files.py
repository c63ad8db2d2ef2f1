"""common/files.py: the one atomic write (text, JSON, bytes, torch, streams) and reads that name the file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from skillnet.common import files


def test_a_write_replaces_the_file_whole_fsyncs_and_leaves_no_temporary(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    target = tmp_path / "deep" / "a.json"
    files.atomic_write_json(target, {"x": "中文"})
    assert target.read_text(encoding="utf-8") == '{\n  "x": "中文"\n}\n' and synced
    files.atomic_write_text(target, "second\n")
    assert target.read_text(encoding="utf-8") == "second\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["a.json"]
    # the permissions open() would give (mkstemp's own 0600 would hide a shared folder's files)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~files._UMASK


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path: Path) -> None:
    target = tmp_path / "records.jsonl"
    files.atomic_write_text(target, "old\n")

    def broken(f) -> None:
        f.write("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        files.atomic_write(target, broken)
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["records.jsonl"]


def test_a_sole_writer_removes_what_killed_writes_left(tmp_path: Path) -> None:
    target = tmp_path / "shard-000001.json"
    for left in (".shard-000001.json.ab12cd.tmp", ".shard-000001.json.x.tmp"):
        (tmp_path / left).write_text("")
    other = tmp_path / ".shard-000002.json.ab12cd.tmp"  # another file's: not ours to remove
    other.write_text("")
    assert files.remove_temporaries(target) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name]


def test_streams_bytes_and_torch_objects(tmp_path: Path) -> None:
    assert files.atomic_write(tmp_path / "n.txt", lambda f: f.write("a\nb\n")) == 4  # the writer's result
    files.atomic_write_bytes(tmp_path / "b.bin", b"\x00\xff")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff"
    files.atomic_torch_save({"w": torch.arange(3)}, tmp_path / "s.pt")
    assert torch.equal(torch.load(tmp_path / "s.pt")["w"], torch.arange(3))


def test_read_errors_name_the_option_and_the_file(tmp_path: Path) -> None:
    binary = tmp_path / "vocab.bin"
    binary.write_bytes(b"a\xb1b")
    with pytest.raises(files.InputFileError, match=rf"^--vocab {binary}: not UTF-8 text \(byte 0xb1 at offset 1\)"):
        files.read_text(binary, option="--vocab")
    with pytest.raises(files.InputFileError, match=rf"^--input {tmp_path / 'none'}: file not found$"):
        files.read_bytes(tmp_path / "none", option="--input")
    with pytest.raises(files.InputFileError, match=rf"^{tmp_path}: is a folder"):
        files.read_bytes(tmp_path)
    assert files.read_text(binary, data=b"ok") == "ok"
