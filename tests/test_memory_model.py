"""The memory model (experiments/memory.py) against what it models: the activations against
the tensors autograd saves, the model states against DeepSpeed's own estimators, and the whole peak against a
measured CPU training step (±15%). The real-size runs (BERT-base / BART-base through DeepSpeed) are item 1's."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from skillnet.experiments import memory as M

from tests.fixtures.memory_step import measure_in_subprocess

REPO = Path(__file__).resolve().parents[1]


def _saved_bytes(arch: str, preset: str, task: str, B: int, T: int, ckpt: bool) -> int:
    """Distinct non-parameter storages autograd keeps after the forward pass, plus the returned logits."""
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining
    from skillnet.model.bart import SkillNetBartConfig, SkillNetBartForConditionalGeneration

    torch.manual_seed(0)
    ids = torch.randint(5, 1000, (B, T))
    kw = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "task": task}
    if arch == "bert":
        m = SkillNetBertForPreTraining(SkillNetBertConfig.preset(preset))
        if task == "mlm":  # the modelled share of the tokens, exactly
            pick = torch.zeros(B * T, dtype=torch.bool)
            pick[torch.randperm(B * T)[: math.ceil(M.MLM_PROBABILITY * B * T)]] = True
            kw["labels"] = torch.where(pick.view(B, T), ids, -100)
        else:
            kw["next_sentence_label"] = torch.zeros(B, dtype=torch.long)
    else:
        m = SkillNetBartForConditionalGeneration(SkillNetBartConfig.preset(preset))
        kw["labels"] = torch.randint(5, 1000, (B, T))
    m.train()
    if ckpt:
        m.activation_checkpointing_enable()
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = m(**kw)
    seen.setdefault(out.logits.untyped_storage().data_ptr(), out.logits.untyped_storage().nbytes())
    return sum(seen.values())


@pytest.mark.parametrize(("arch", "task", "B", "T", "ckpt"), [
    ("bert", "mlm", 4, 64, False),
    ("bert", "nsp", 4, 64, False),
    ("bert", "nsp", 4, 64, True),
    ("bart", "dialogue_generation", 4, 32, False),
    ("bart", "dialogue_generation", 4, 32, True),
])
def test_activations_are_what_autograd_keeps(arch: str, task: str, B: int, T: int, ckpt: bool) -> None:
    # On a CPU (math attention: the probabilities are kept; dropout masks in fp32), fp32, tiny preset.
    s = M.Setup(arch=arch, preset="tiny", objective=task, dtype="fp32", zero=None, micro_batch=B, seq_len=T,
                device="cpu", checkpointing=ckpt)
    saved = sum(b.saved for b in M.blocks(s, task))  # what autograd keeps at the end of the forward (+ logits)
    assert saved == pytest.approx(_saved_bytes(arch, "tiny", task, B, T, ckpt), rel=0.02)


@pytest.mark.parametrize(("stage", "offload"), [(2, False), (2, True), (3, False)])
def test_model_states_agree_with_deepspeeds_estimators(stage: int, offload: bool) -> None:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    s = M.Setup(preset="base", dtype="fp16", zero=stage, offload=offload, world_size=32)
    st = M.model_states(s)
    ours = st["params"] + st["grads"] + st["grads32"] + st["master"] + st["moments"]
    c = M.counts("bert", "base")
    if stage == 2:
        theirs = estimate_zero2_model_states_mem_needs(c["total"], 8, 4, cpu_offload=offload)[1]
    else:
        # DeepSpeed counts the gathered layer at 4 bytes a parameter; we count it and the prefetch bucket in fp16
        theirs = estimate_zero3_model_states_mem_needs(c["total"], c["largest_layer"], 8, 4, cpu_offload=False)[1]
    assert ours == pytest.approx(theirs, rel=0.15)


def test_the_paper_recipe_is_read_from_its_json() -> None:
    s = M.deepspeed_setup(REPO / M.PAPER_JSON)
    assert (s.dtype, s.zero, s.world_size, s.micro_batch, s.seq_len) == ("fp16", 2, 32, 32, 512)
    assert (s.reduce_bucket, s.allgather_bucket, s.offload, s.checkpointing) == (50_000_000, 50_000_000, False, False)
    r = M.predict(s)
    assert r["task"] in ("mlm", "nsp") and r["peak"] > r["activations"] > 0
    ckpt = M.predict(M.deepspeed_setup(REPO / M.PAPER_JSON, checkpointing=True))
    assert ckpt["activations"] < r["activations"] / 5 and ckpt["peak"] < r["peak"]


# The cases: states-dominated (small preset), activations-dominated (long sequences, attention probabilities,
# MLM logits; with checkpointing), and SkillNet-BART (LM logits at every target token).
MEASURED = [
    ("bert", "small", ["mlm", "mlm"], 8, 128, False),
    ("bert", "tiny", ["nsp", "mlm"], 16, 256, True),
    ("bart", "tiny", ["dialogue_generation", "dialogue_generation"], 8, 128, False),
]


@pytest.mark.slow  # three training processes, ~30-45 s each on a shared 2-core CPU
@pytest.mark.parametrize(("arch", "preset", "tasks", "B", "T", "ckpt"), MEASURED)
def test_peak_is_within_15_percent_of_a_measured_cpu_step(arch: str, preset: str, tasks: list[str], B: int, T: int,
                                                          ckpt: bool) -> None:
    measured = measure_in_subprocess(arch, preset, tasks, B, T, ckpt)["peak_above_baseline"]
    s = M.Setup(arch=arch, preset=preset, dtype="fp32", zero=None, micro_batch=B, seq_len=T, device="cpu",
                checkpointing=ckpt, trained_objectives=tuple(dict.fromkeys(tasks)))
    predicted = M.predict(s)["peak"]
    assert predicted == pytest.approx(measured, rel=0.15), f"predicted {predicted / 1e6:.0f} MB, measured {measured / 1e6:.0f} MB"


def test_write_replaces_only_the_memory_section(tmp_path: Path) -> None:
    doc = tmp_path / "scale.md"
    doc.write_text("# Scale\n\nprose by hand\n\n<!-- bench:estimate:begin -->\nestimate table\n"
                   "<!-- bench:estimate:end -->\n\n<!-- bench:memory:begin -->\nold\n<!-- bench:memory:end -->\n")
    assert M.main(["--write", str(doc)]) == 0
    text = doc.read_text()
    assert "prose by hand" in text and "estimate table" in text and "old" not in text
    rows = [line for line in text.splitlines() if line.startswith(tuple(f"| {g} |" for g in M.GPUS))]
    assert len(rows) == len(M.GPUS)
    # every card: the paper recipe's verdict and 12 micro-batches, checkpointing never fitting fewer
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1].startswith(("yes", "no")) and len(cells) == 14
        sizes = [int(c.removeprefix(">= ")) for c in cells[2:]]
        assert all(with_ckpt >= without for without, with_ckpt in zip(sizes[::2], sizes[1::2]))


def test_a_measured_step_does_not_read_its_parents_memory() -> None:
    """Linux carries ru_maxrss across exec from the forking parent: under a long pytest run (a large parent)
    the measured CPU step read the parent's RSS (1347 MB for a 389 MB step). The measurement reads its own
    process image's high-water mark instead."""
    big = bytearray(800_000_000)
    big[::4096] = b"\x01" * len(big[::4096])  # resident, not just reserved
    measured = measure_in_subprocess("bert", "tiny", ["mlm"], 2, 32)["peak_above_baseline"]
    del big
    assert measured < 200e6, f"measured {measured / 1e6:.0f} MB for a tiny BERT step"


def test_drift_reference_is_the_skill_statistics_copy() -> None:
    """Rank 0 of pre-training keeps SkillStatistics' start weights of every skill (host memory, fp32): the
    model's term is the size of exactly that copy, and it is absent under ZeRO-3 (no drift there)."""
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining, skill_parameters
    from skillnet.training import SkillStatistics

    copy = SkillStatistics(skill_parameters(SkillNetBertForPreTraining(SkillNetBertConfig.preset("tiny"))))._tensors()
    for stage, offload in ((None, False), (2, False), (2, True), (3, False)):
        s = M.Setup(preset="tiny", dtype="fp32", zero=stage, offload=offload, world_size=1 if stage is None else 2)
        plain, rank0 = M.model_states(s), M.model_states(replace(s, drift_reference=True))
        expected = 0 if stage == 3 else sum(t.numel() * t.element_size() for t in copy.values())
        assert rank0.get("host", 0) - plain.get("host", 0) == expected
        assert M.predict(replace(s, drift_reference=True))["peak"] == M.predict(s)["peak"]  # host, not device


def test_fp32_zero2_gradients_live_from_the_backward_to_the_step() -> None:
    """fp32 ZeRO-1/2: the gradient partition fills during the backward (at most the partition, at the top only what
    the top blocks produced) and the step adds its flattened copy; mixed precision keeps the static buffers."""
    s = M.Setup(preset="base", dtype="fp32", zero=2, world_size=2, micro_batch=2, seq_len=512, device="cpu")
    r, st = M.predict(replace(s, objective="nsp")), M.model_states(s)
    static = st["params"] + st["master"] + st["moments"]
    assert r["step"] == static + 2 * st["grads"] + st["step_temp"]
    top = M.blocks(s, "nsp")
    # the sweep's peak (at the top of the backward here) holds far less than the whole partition
    assert r["backward_peak_at"] == "layer 11" and r["sweep"] < sum(b.saved for b in top) + st["grads"] / 4
    assert r["peak"] == static + st["buckets"] + r["sweep"]
    for mixed in (replace(s, dtype="fp16"), replace(s, offload=True), replace(s, zero=3)):
        m, ms = M.predict(replace(mixed, objective="nsp")), M.model_states(mixed)
        assert m["step"] == sum(ms[k] for k in ("params", "master", "moments", "grads", "grads32", "step_temp"))


def test_zero3_keeps_the_activated_parameters_gathered_unless_reuse_distance_is_short() -> None:
    s = M.deepspeed_setup(REPO / "ds_configs" / "zero3.json", "bert", "base", 128, world_size=2, device="cpu")
    assert (s.zero, s.prefetch_bucket, s.max_live_parameters, s.max_reuse_distance) == (3, 50_000_000, 10**9, 10**9)
    c = M.counts("bert", "base")
    for task in ("mlm", "nsp"):
        kept = M.predict(replace(s, objective=task))["peak"]
        eager = M.predict(replace(s, objective=task, max_reuse_distance=1000))["peak"]
        assert kept - eager == 4 * (c["activated"][task] - c["largest_layer"])
        capped = M.predict(replace(s, objective=task, max_live_parameters=c["largest_layer"]))["peak"]
        assert capped == eager


def test_proc_bytes_reads_kb_fields() -> None:
    assert M.proc_bytes("VmRSS") > 10**6 and M.proc_bytes("MemTotal", "/proc/meminfo") > 10**8
    assert M.proc_bytes("NoSuchField") == 0
