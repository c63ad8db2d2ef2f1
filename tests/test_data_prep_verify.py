"""`data_prep verify` guarantees a loadable shard, also when the checksums were recomputed after an edit:
token ids below the vocab size, `.idx` offsets increasing and inside the `.bin`.
The pre-training data path checks the same cheaply, so training never dies in F.embedding."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from skillnet.data_prep.build import BuildConfig, build
from skillnet.data_prep.shards import IDX_HEADER_BYTES, ShardError, load_manifest
from skillnet.pretrain import run as run_mod
from skillnet.pretrain.dataset import PretrainingDataset

from tests.test_data_prep_build import make_docs

REPO = Path(__file__).resolve().parents[1]
VICTIM = "shard-000001"


@pytest.fixture()
def shards(tmp_path: Path) -> Path:
    docs = make_docs(120, seed=4)
    (tmp_path / "c.txt").write_text("\n".join("".join(s) for s in docs) + "\n", encoding="utf-8")
    build(
        BuildConfig(
            inputs=[str(tmp_path / "c.txt")], out=str(tmp_path / "out"), unit_bytes=2000, progress=False
        )
    )
    return tmp_path / "out"


def recompute_checksums(shard_dir: Path, name: str) -> None:
    """What someone editing a shard by hand would do so that sizes and sha256 match again."""
    rec_path = shard_dir / f"{name}.json"
    rec = json.loads(rec_path.read_text())
    for ext, meta in rec["files"].items():
        data = (shard_dir / f"{name}.{ext}").read_bytes()
        meta.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    rec_path.write_text(json.dumps(rec))
    manifest = json.loads((shard_dir / "manifest.json").read_text())
    manifest["shards"] = [rec if r["name"] == name else r for r in manifest["shards"]]
    (shard_dir / "manifest.json").write_text(json.dumps(manifest))


def _edit_bin(d: Path) -> None:
    m = load_manifest(d)
    toks = np.fromfile(d / f"{VICTIM}.bin", dtype=m["tokenizer"]["dtype"])
    toks[len(toks) // 2] = m["tokenizer"]["vocab_size"] + 2  # still fits uint16
    toks.tofile(d / f"{VICTIM}.bin")


def _idx_entries(d: Path) -> tuple[bytes, np.ndarray]:
    raw = (d / f"{VICTIM}.idx").read_bytes()
    return raw[:IDX_HEADER_BYTES], np.frombuffer(raw[IDX_HEADER_BYTES:], dtype="<u8").copy()


def _edit_idx_order(d: Path) -> None:
    head, e = _idx_entries(d)
    e[3], e[4] = e[4], e[3]  # two sentence ends swapped: not increasing
    (d / f"{VICTIM}.idx").write_bytes(head + e.tobytes())


def _edit_idx_past_end(d: Path) -> None:
    head, e = _idx_entries(d)
    n_sent = int(np.frombuffer(head[16:24], dtype="<u8")[0])
    e[n_sent - 1] += 40  # the last sentence ends past the end of the .bin
    (d / f"{VICTIM}.idx").write_bytes(head + e.tobytes())


EDITS: dict[str, tuple[Callable[[Path], None], str]] = {
    "token_id_out_of_vocab": (_edit_bin, r"shard-000001\.bin: token id 21130 .*>= vocab size 21128"),
    "sentence_ends_not_increasing": (_edit_idx_order, r"shard-000001\.idx: sentence ends not increasing"),
    "offsets_past_bin": (_edit_idx_past_end, r"shard-000001\.idx: .*past the end of shard-000001\.bin"),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_verify_fails_on_an_edited_shard_with_recomputed_checksums(shards: Path, edit: str) -> None:
    change, message = EDITS[edit]
    change(shards)
    recompute_checksums(shards, VICTIM)
    r = subprocess.run(
        [sys.executable, "-m", "skillnet.data_prep", "verify", str(shards)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    err = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and "Traceback" not in r.stderr, r.stderr
    assert re.search(message, err[0]), err[0]
    with pytest.raises(ShardError, match=message):
        PretrainingDataset(shards)  # verify="full" (default) checks the same


def test_index_checked_at_load_even_with_size_verification(shards: Path) -> None:
    for change in (_edit_idx_order, _edit_idx_past_end):
        change(shards)
        recompute_checksums(shards, VICTIM)
        with pytest.raises(ShardError, match=r"shard-000001\.idx"):
            PretrainingDataset(shards, verify="size")
        build(
            BuildConfig(
                inputs=[str(shards.parent / "c.txt")], out=str(shards), unit_bytes=2000, progress=False
            )
        )


def test_out_of_vocab_token_is_a_shard_error_in_the_batch_not_an_index_error(shards: Path) -> None:
    """Without the full scan (verify="size"/"none"), the batch that reads the token names it."""
    _edit_bin(shards)
    recompute_checksums(shards, VICTIM)
    ds = PretrainingDataset(shards, max_seq_len=32, verify="size")
    for obj in ("mlm", "nsp"):
        with pytest.raises(
            ShardError, match=r"shard-000001\.bin: token id 21130 at position \d+ >= vocab size 21128"
        ):
            for epoch in range(20):  # NSP pairs do not read every token each epoch
                for start in range(0, ds.num_samples, 64):
                    ds.batch(range(start, min(start + 64, ds.num_samples)), epoch, obj)


def test_pretraining_on_an_edited_shard_ends_with_one_error_line(
    shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _edit_bin(shards)
    recompute_checksums(shards, VICTIM)
    argv = [
        "--shards",
        str(shards),
        "--max_seq_len",
        "32",
        "--max_steps",
        "1",
        "--output_dir",
        str(tmp_path / "o"),
    ]
    assert run_mod.main([*argv, "--no_progress", "--no_tensorboard"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "shard-000001.bin: token id 21130" in err[0]
