"""What every task codec shares: the `TaskCodec` interface, the encoded row, and the tokenising and padding
helpers the built-in codecs use.

A codec is stateless; every hook takes the `TaskData` it serves (``td``), which holds the task's config,
tokenizer, records, label list and caches. The codecs sit below the config (whose checks ask them) and the
task data (which calls them), so they read both through the protocols `TaskSettings` and `TaskView` rather
than import them. The hooks, in the order a run calls them:

* ``check_config(cfg)``: type-specific checks of a `TaskConfig` (raise ValueError);
* ``infer_kind(td, load_splits)``, ``positive_label(td)``: settled while the data loads;
* ``encode(td, recs, split)``: records -> `Encoded` rows (and how many were truncated);
* ``collate(td, feats, with_labels)`` / ``train_batch(td, indices, seed, draw)``: rows -> model inputs;
* ``predict(td, model, recs, split, batch_size, progress)`` through ``decode(td, model, feats, batch)``:
  model outputs -> predictions in the task's label space;
* ``score(td, recs, preds)`` and ``trivial(td, recs)``: metrics, and the predictions of a trivial predictor;
* ``present(rec, pred)``, ``sample(rec, pred)``: what ``finetune.predict`` writes and ``samples.json`` keeps.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch


class TaskSettings(Protocol):
    """What a codec reads of a task's config (finetune/task_config.py's `TaskConfig` is one)."""

    name: str
    type: str
    columns: dict[str, str]
    labels: list[str] | None
    positive_label: str | None
    head: dict[str, Any]
    metric: str | None
    num_negatives: int
    max_target_len: int
    num_beams: int
    lang: str
    source_prefix: str
    max_seq_len: int
    doc_stride: int | None
    max_question_len: int | None


class TaskView(Protocol):
    """What a codec reads of the task it serves (finetune/tasks.py's `TaskData` is one)."""

    cfg: TaskSettings
    name: str
    tok: Any
    max_len: int
    kind: str | None
    label_list: list[str] | None
    positive_label: str | None
    records: dict[str, list[dict[str, Any]]]
    sources: dict[str, Any]
    files: dict[str, str]
    skipped_windows: int

    @property
    def num_labels(self) -> int: ...

    def features(self, split: str) -> list[Encoded]: ...

    packing: bool  # the run packs rows (evaluation batches too, where outputs are read per example)

    def pack(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def encode_records(self, recs: list[dict[str, Any]]) -> list[Encoded]: ...

    def decode_text(self, ids: Sequence[int]) -> str: ...


def stable_hash(s: str) -> int:
    return int.from_bytes(hashlib.sha256(s.encode()).digest()[:4], "little")


@dataclass
class Encoded:
    """One model input row (lists of ints) plus what decoding needs."""

    input_ids: list[int]
    token_type_ids: list[int]
    extra: dict[str, Any] = field(default_factory=dict)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# A head option: (what it must be, in words; its check).
HeadOption = tuple[str, Callable[[Any], bool]]
DROPOUT: HeadOption = ("a number in [0, 1)", lambda v: _num(v) and 0 <= v < 1)
MAX_ANSWER_LEN: HeadOption = ("an integer >= 1", lambda v: _int(v) and v >= 1)
MAX_CANDIDATES: HeadOption = ("an integer >= 0 (0 = all)", lambda v: _int(v) and v >= 0)


# ---------------------------------------------------------------------------------------- helpers
# Texts whose pieces are kept, per tokenizer fingerprint (so the runs of one comparison process share them).
# Evaluation re-encodes the same texts at every evaluation (matching groups are built per batch, long shared
# answers recur across groups), which cost more than the training steps of a CPU run; the cap keeps memory
# bounded on full-size datasets.
PIECE_CACHE_MAX = 500_000
_PIECE_CACHES: dict[str, dict[str, tuple[list[int], list[tuple[int, int]]]]] = {}


def piece_cache(tok: Any) -> dict[str, tuple[list[int], list[tuple[int, int]]]]:
    key = getattr(tok, "fingerprint", None)
    if key is None:  # a tokenizer without a fingerprint keeps its own
        return tok.__dict__.setdefault("_piece_cache", {})
    return _PIECE_CACHES.setdefault(key, {})


def pieces(tok: Any, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """Word-piece ids and character offsets of each text (no special tokens). Cached: the lists returned
    are shared, so callers copy before they change one."""
    cache = piece_cache(tok)
    missing = [t for t in dict.fromkeys(texts) if t not in cache]
    if missing:
        encs = tok.backend.encode_batch(missing, add_special_tokens=False)
        if len(cache) + len(missing) > PIECE_CACHE_MAX:
            fresh = {t: (e.ids, e.offsets) for t, e in zip(missing, encs)}
            return [cache[t] if t in cache else fresh[t] for t in texts]
        cache.update((t, (e.ids, e.offsets)) for t, e in zip(missing, encs))
    return [cache[t] for t in texts]


def piece_ids(tok: Any, texts: Sequence[str]) -> list[list[int]]:
    return [ids for ids, _ in pieces(tok, texts)]


def kept_lengths(na: int, nb: int | None, max_len: int) -> tuple[int, int]:
    """How many pieces of `a` (and `b`: None for one text) fit ``[CLS] a [SEP] (b [SEP])`` in ``max_len``, cut
    longest-first as transformers' tokenizers do (``truncation=True``), so that a plain export's tokenizer cuts
    exactly as training and ``predict`` did: the shorter text (`a` on a tie) keeps up to half the budget, the
    longer one the rest."""
    budget = max(0, max_len - (3 if nb is not None else 2))
    if nb is None:
        return min(na, budget), 0
    if na + nb <= budget:
        return na, nb
    if na > nb:
        kb = min(nb, budget // 2)
        return min(na, budget - kb), kb
    ka = min(na, budget // 2)
    return ka, min(nb, budget - ka)


def cut_texts(tok: Any, a: str, b: str | None, max_len: int) -> tuple[str, str | None]:
    """The characters of `a` (and `b`) whose pieces ``pair`` keeps at ``max_len``: what a model of the task
    reads of them (``kept_lengths``, mapped back through the pieces' character offsets)."""
    (ia, oa), *rest = pieces(tok, [a] if b is None else [a, b])
    ob = rest[0][1] if rest else []
    na, nb = kept_lengths(len(ia), len(ob) if b is not None else None, max_len)

    def keep(text: str, offsets: list[tuple[int, int]], n: int) -> str:
        return text if n == len(offsets) else text[:offsets[n - 1][1]] if n else ""

    return keep(a, oa, na), (keep(b, ob, nb) if b is not None else None)


def pair(tok: Any, a: list[int], b: list[int] | None, max_len: int) -> Encoded:
    """``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``, cut longest-first to ``max_len`` as transformers'
    tokenizers cut (``kept_lengths``); ``extra["truncated"]`` says whether anything was cut."""
    na, nb = kept_lengths(len(a), len(b) if b is not None else None, max_len)
    cut = na < len(a) or (b is not None and nb < len(b))
    a, b = list(a[:na]), (list(b[:nb]) if b is not None else None)
    cls, sep = tok.cls_id, tok.sep_id
    ids = [cls] + a + [sep]
    tt = [0] * len(ids)
    if b is not None:
        ids += b + [sep]
        tt += [1] * (len(b) + 1)
    return Encoded(ids, tt, {"truncated": cut})


def pad(rows: list[list[int]], value: int) -> torch.Tensor:
    T = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (T - len(r)) for r in rows], dtype=torch.long)


def bert_inputs(tok: Any, feats: list[Encoded]) -> dict[str, torch.Tensor]:
    """The encoder inputs of a batch of rows, padded to its longest row."""
    return {
        "input_ids": pad([f.input_ids for f in feats], tok.pad_id),
        "token_type_ids": pad([f.token_type_ids for f in feats], 0),
        "attention_mask": pad([[1] * len(f.input_ids) for f in feats], 0),
    }


def iter_chunks(n: int, bs: int, progress: bool, desc: str) -> Iterator[range]:
    starts: Any = range(0, n, bs)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc=desc, unit="batch", leave=False)
    for s in starts:
        yield range(s, min(n, s + bs))


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


# ---------------------------------------------------------------------------------------- interface
class TaskCodec:
    """One task type: its config facts (class attributes) and the hooks that turn its records into model
    inputs and model outputs into scored predictions. Subclass, set the attributes, implement ``encode``,
    ``collate``, ``decode``, ``score`` and ``trivial`` (or override ``predict``/``train_batch`` where one
    row is not one example), and `register` an instance."""

    name: ClassVar[str]  # the task ``type`` of the config
    head: ClassVar[str | None]  # the model head (model/heads.py); None: the shared LM head (BART)
    kinds: ClassVar[tuple[str, ...]]  # data kinds it reads (data_prep.tasks.schema); the first is the default
    metrics: ClassVar[tuple[str, ...]]  # what ``score`` returns that a config may select on
    metric: ClassVar[str]  # the default selection metric
    head_options: ClassVar[dict[str, HeadOption]] = {}  # settings a task may give under ``head``
    arch: ClassVar[str] = "bert"  # the architecture it runs on (a family of model/spec.py)
    labelled: ClassVar[bool] = False  # a closed label list: the head has one output per label
    regression: ClassVar[bool] = False  # labels are numbers (the loader checks them as such)
    shows_samples: ClassVar[bool] = False  # final scoring keeps the first outputs in samples.json
    # How its training rows hold several examples each (TrainConfig.packing; training/packing.py), or None:
    # "pooled", its head reads each example's [CLS] alone; "tokens", its head reads every token of an
    # example, moved back to one example per row after the encoder; "pairs", an encoder-decoder's source
    # and target sides pack together.
    packs: ClassVar[str | None] = None
    decoder: ClassVar[bool] = False  # its batches have a decoder side (labels = targets; training/batch.py)

    # ----------------------------------------------------------------------------- config and loading
    def check_config(self, cfg: TaskSettings) -> None:
        """Type-specific checks of a task config (raise ValueError); the last check `TaskConfig` runs."""
        if cfg.positive_label is not None:
            raise ValueError(f"positive_label applies to classification tasks, not {cfg.type!r}")

    def infer_kind(self, td: TaskView, load_splits: Sequence[str]) -> tuple[str, str]:
        """The data kind of a task whose config and spec name none, and a note on how it was inferred
        (added to data errors)."""
        return self.kinds[0], ""

    def positive_label(self, td: TaskView) -> str | None:
        """The class whose F1 is the ``f1`` metric, checked against the loaded labels (None: no such class)."""
        return None

    def meta(self, td: TaskView) -> dict[str, Any]:
        """What prediction needs beyond type, kind, labels, skills and lengths (``finetune_tasks.json``)."""
        return {}

    def config_from_meta(self, meta: dict[str, Any]) -> dict[str, Any]:
        """`TaskConfig` fields back from what ``meta`` wrote."""
        return {}

    def plan_lines(self, td: TaskView) -> list[str]:
        """Lines the run's start-up plan prints about this task's data (span: its windows)."""
        return []

    def head_spec(self, td: TaskView) -> dict[str, Any]:
        spec = {"type": self.head, "num_labels": max(td.num_labels, 1), **td.cfg.head}
        if self.labelled:
            spec["labels"] = list(td.label_list or [])
        return spec

    # ----------------------------------------------------------------------------- encoding and batches
    def encode(self, td: TaskView, recs: list[dict[str, Any]], split: str) -> tuple[list[Encoded], int]:
        """Rows of `recs` (a split, or ``"__predict__"`` for records to label) and how many records
        ``max_seq_len`` cut."""
        raise NotImplementedError

    def collate(self, td: TaskView, feats: list[Encoded], with_labels: bool) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def num_train_rows(self, td: TaskView) -> int:
        """Rows a training pass draws from (what the sampler sizes the task by)."""
        return len(td.features("train"))

    def train_batch(self, td: TaskView, indices: Sequence[int], seed: int, draw: int) -> dict[str, torch.Tensor]:
        feats = td.features("train")
        return self.collate(td, [feats[i] for i in indices], with_labels=True)

    # ----------------------------------------------------------------------------- predictions and scores
    def predict(self, td: TaskView, model: Any, recs: list[dict[str, Any]], split: str | None, bs: int,
                progress: bool) -> list[Any]:
        """One prediction per record (`split`'s cached rows, or `recs` encoded now)."""
        device = next(model.parameters()).device
        feats = td.features(split) if split is not None else td.encode_records(recs)
        preds: list[Any] = []
        for chunk in iter_chunks(len(feats), bs, progress, td.name):
            fs = [feats[i] for i in chunk]
            preds += self.decode(td, model, fs, to_device(self.eval_batch(td, fs), device))
        return preds

    def eval_batch(self, td: TaskView, feats: list[Encoded]) -> dict[str, torch.Tensor]:
        """An evaluation batch of `feats`, packed where the run packs and the type's outputs are read per
        example (a beam search decodes each example in its own row)."""
        batch = self.collate(td, feats, with_labels=False)
        return td.pack(batch) if getattr(td, "packing", False) and self.packs in ("pooled", "tokens") else batch

    def decode(self, td: TaskView, model: Any, feats: list[Encoded], batch: dict[str, torch.Tensor]) -> list[Any]:
        """The model's predictions for one collated batch of `feats`, in the task's label space."""
        raise NotImplementedError

    def score(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, float]:
        raise NotImplementedError

    def trivial(self, td: TaskView, recs: list[dict[str, Any]]) -> list[Any]:
        """The predictions of the trivial predictor that ``trivial_baseline`` scores."""
        raise NotImplementedError

    def example_stats(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, Any] | None:
        """One row of numbers per example from which ``score``'s main metric (``td.cfg.metric``) is recomputed
        exactly on any resample of the examples (``finetune.stats.example_stats``), or None where the type keeps
        none for that metric: a comparison then falls back to the seeds' t-test, and says so."""
        return None

    # A non-neural baseline learnt from the train split (``lexical_baseline``), or None where the type has
    # none: a neural row below it has not learnt more than which characters occur.
    lexical_name: str | None = None

    def lexical(self, td: TaskView, recs: list[dict[str, Any]], train: list[dict[str, Any]] | None = None
                ) -> list[Any] | None:
        """Predictions of the baseline fit on `train` (default: the task's train split)."""
        return None

    def cut_for_model(self, td: TaskView, recs: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """`recs` with their texts cut to what the model reads at max_seq_len (for the lexical baseline on the
        same view), or None where the type has no such cut."""
        return None

    def present(self, rec: dict[str, Any], pred: Any) -> Any:
        """What ``finetune.predict`` writes as the record's ``prediction``."""
        return pred

    def sample(self, rec: dict[str, Any], pred: Any) -> dict[str, Any]:
        """One entry of ``samples.json`` (codecs with ``shows_samples``)."""
        raise NotImplementedError
