"""Task data for fine-tuning: loading (via data_prep.tasks), the features cache, the batch order, and the
calls into the task type's codec (finetune/task_types/: encoding, batches, decoding and scoring), one
`TaskData` per task.

Chinese text with the bert-base-chinese vocab is tokenised one character per token, so NER tags and
answer spans align to characters; the codecs nevertheless work from the tokenizer's offsets and word
ids, so word pieces (Latin words, numbers) are handled too (see each codec for its rows).

Batches are deterministic in ``(seed, task, draw)``: the order of a task's examples is a permutation
per pass over the data, seeded by ``(seed, task, pass)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from skillnet.data_prep.tasks.schema import (
    LoadReport,
    TaskDataError,
    TaskSpec,
    dataset_splits,
    load_task_file,
)
from skillnet.model.attention import pack_row_factor

from .config import FinetuneConfig, TaskConfig
from .task_types import Encoded, TaskCodec, codec_for
from .task_types.base import stable_hash as _stable_hash

__all__ = ["Encoded", "TaskData"]

log = logging.getLogger("finetune")

# Lexical baseline scores by what they are computed from (TaskData._lexical_key): every run of a comparison fits
# the same baseline on the same data (TF-IDF over thousands of long insurance answers takes tens of seconds), so
# a process that runs many of them (`compare --in-process`) fits each once.
_LEXICAL_SCORES: dict[str, dict[str, float] | None] = {}
# Settings that cannot change a lexical baseline's score: which skills a run uses, where the data came from and
# how much was kept (the records themselves are part of the key). The head stays: matching scores the
# candidates its max_candidates keeps.
_NOT_LEXICAL = {"skills", "train", "dev", "test", "spec", "dataset", "max_train_examples", "max_eval_examples",
                "max_dev_examples"}


def cut_what(limit: str, per_limit: bool = True) -> str:
    """What a length limit cuts, for messages: a generation task's max_seq_len its sources, max_target_len its
    targets; a task that reports no per-limit cuts, whole examples."""
    return "targets" if limit == "max_target_len" else ("sources" if per_limit else "examples")


class TaskData:
    """Everything about one task's data: records, label list, features, batches, scoring (through
    ``self.codec``, the codec of the task's type)."""

    def __init__(self, cfg: TaskConfig, ft: FinetuneConfig | None, tokenizer: Any, *, skip_bad: bool = False,
                 load_splits: Sequence[str] = ("train", "dev", "test")) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.tok = tokenizer
        self.max_len = cfg.max_seq_len
        self.sources: dict[str, Any] = {}  # split -> a path, a datasets.Dataset or a split of a whole dataset
        self.files: dict[str, str] = {}  # split -> what messages call it (the path, or a label for an object)
        self.kind = cfg.kind
        self.label_list: list[str] | None = cfg.labels
        self.codec: TaskCodec = codec_for(cfg.type)
        self.regression = self.codec.regression
        # Whether the run packs rows (TrainConfig.packing): training batches in the source, evaluation
        # batches of the types whose outputs are read per example (not beam search) in the codec.
        self.packing = bool(ft.train.packing) if ft is not None else False
        # how long a packed row may grow is the attention seam's cost rule, by the kernel --compile leaves
        self.row_factor = pack_row_factor(ft is not None and ft.train.compile)
        if ft is not None:
            self._collect_sources(ft)
        self.kind_note = ""  # how the kind was inferred, for error messages
        if self.kind is None:
            self.kind, self.kind_note = self.codec.infer_kind(self, load_splits)
        self.records: dict[str, list[dict[str, Any]]] = {}
        self.reports: dict[str, LoadReport] = {}
        self.skipped_windows = 0
        self._truncated: dict[str, int] = {}
        self._cuts: dict[str, dict[str, int]] = {}  # split -> {limit that cut (max_seq_len, ...): examples}
        self.cuts_per_limit = False  # whether the codec says which limit cut each row (generation)
        for split in load_splits:
            if split in self.sources:
                self._load(split, skip_bad)
        if "train" in load_splits and "train" not in self.records:
            raise TaskDataError(f"<config task {self.name!r}>", 0, "no training data (give 'train', a 'dataset' with a "
                                "train split, or a spec with one)")
        self._features: dict[str, list[Encoded]] = {}
        if load_splits and self.codec.labelled and self.num_labels < 2:
            raise TaskDataError(self.files.get("train", self.name), 0,
                                f"task {self.name!r} needs at least 2 labels, found {self.label_list}; "
                                "list them under 'labels' in the config")
        self.positive_label = self.codec.positive_label(self) if load_splits else cfg.positive_label

    def _collect_sources(self, ft: FinetuneConfig) -> None:
        """Where each split comes from, by precedence: the spec's files, then the splits of `dataset`, then
        the explicit `train`/`dev`/`test` entries (paths relative to the config file, or Dataset objects)."""
        cfg = self.cfg
        if cfg.spec:
            spec_path = ft.resolve(cfg.spec)
            spec = TaskSpec.load(spec_path)
            self.kind = self.kind or spec.kind
            if self.label_list is None:
                self.label_list = spec.label_list
            for split in ("train", "dev", "test"):
                if split in spec.files:
                    self.sources[split] = self.files[split] = str(spec.path_of(split, spec_path))
        if cfg.dataset is not None:
            if isinstance(cfg.dataset, str):
                whole, where = ft.resolve(cfg.dataset), ft.resolve(cfg.dataset)
            else:  # a datasets.DatasetDict
                whole, where = cfg.dataset, f"<{self.name}: datasets.DatasetDict>"
            for split, part in dataset_splits(whole, name=where).items():
                self.sources[split], self.files[split] = part, part.name
        for split in ("train", "dev", "test"):
            v = getattr(cfg, split)
            if isinstance(v, str):
                self.sources[split] = self.files[split] = ft.resolve(v)
            elif v is not None:  # a datasets.Dataset (TaskConfig checked the type)
                self.sources[split], self.files[split] = v, f"<{self.name}/{split}: datasets.Dataset>"

    @classmethod
    def for_inference(cls, name: str, meta: dict[str, Any], tokenizer: Any) -> TaskData:
        """A data-less TaskData from the metadata an export carries (``finetune_tasks.json``)."""
        extra = codec_for(meta["type"]).config_from_meta(meta)
        cfg = TaskConfig(name=name, type=meta["type"], skills=list(meta.get("skills") or ["s7"]),
                         train="(not needed for prediction)", kind=meta["kind"], labels=meta.get("labels"),
                         head=dict(meta.get("head") or {}), max_seq_len=int(meta["max_seq_len"]),
                         columns=dict(meta.get("columns") or {}), **extra)
        return cls(cfg, None, tokenizer, load_splits=())

    def meta(self) -> dict[str, Any]:
        """What prediction needs to encode inputs and decode outputs of this task."""
        meta = {"type": self.cfg.type, "kind": self.kind, "labels": self.label_list, "skills": self.cfg.skills,
                "max_seq_len": self.max_len, "head": self.cfg.head, "metric": self.cfg.metric,
                "columns": dict(self.cfg.columns)}  # the task's own format: predict reads it as training did
        meta.update(self.codec.meta(self))
        return meta

    # ------------------------------------------------------------------------------------ loading
    def _load(self, split: str, skip_bad: bool) -> None:
        cap = self.cfg.max_train_examples if split == "train" else self.cfg.max_eval_examples
        if split == "dev" and self.cfg.max_dev_examples is not None:
            cap = self.cfg.max_dev_examples
        try:
            recs, report = self.read(self.sources[split], self.files[split], split, skip_bad=skip_bad)
        except TaskDataError as e:
            if not self.kind_note:
                raise
            raise TaskDataError(e.path, e.line, e.reason + self.kind_note, unit=e.unit) from None
        if cap is not None and len(recs) > cap:
            # A seeded sample, not the first N: converted files may be ordered (e.g. by label), and the
            # first N of a label-sorted dev set would make a one-class dev set.
            keep = sorted(sorted(range(len(recs)), key=lambda i: _stable_hash(f"{split}:{i}"))[:cap])
            recs = [recs[i] for i in keep]
        if self.label_list is None and report.label_list is not None:
            # Train's inferred labels become the closed set for dev/test: an unseen label there is an error.
            self.label_list = list(report.label_list)
        self.records[split] = recs
        self.reports[split] = report
        if report.num_skipped:
            log.warning("%s", report.summary())

    def read(self, source: Any, name: str, split: str, *, skip_bad: bool = False, require_labels: bool = True
             ) -> tuple[list[dict[str, Any]], LoadReport]:
        """The records of `source` as fine-tuning reads a split of this task: its kind, labels and `columns`
        (also what ``export --plain`` measures on, finetune/predict.py)."""
        return load_task_file(source, self.kind, self.label_list, skip_bad, regression=self.regression,
                              require_labels=require_labels, as_dataset=False, columns=self.cfg.columns or None,
                              name=name, split=split)

    @property
    def num_train(self) -> int:
        return len(self.records.get("train", []))

    @property
    def num_labels(self) -> int:
        return len(self.label_list or []) if self.codec.labelled else 1

    def head_spec(self) -> dict[str, Any]:
        return self.codec.head_spec(self)

    # ------------------------------------------------------------------------------------ encoding
    def features(self, split: str) -> list[Encoded]:
        """Encoded rows of `split` (cached). Matching groups are encoded per batch instead."""
        if split in self._features:
            return self._features[split]
        recs = self.records[split]
        feats, truncated = self.codec.encode(self, recs, split)
        self._features[split] = feats
        # A codec whose rows can be cut by more than max_seq_len (generation: max_target_len) says which
        # limit cut each row; every other cut is max_seq_len's.
        per_limit = any("cuts" in f.extra for f in feats)
        self.cuts_per_limit = self.cuts_per_limit or per_limit
        if per_limit:
            cuts = Counter(limit for f in feats for limit in f.extra.get("cuts", ()))
        else:
            cuts = Counter({"max_seq_len": int(truncated)})
        self._cuts[split] = {limit: n for limit, n in cuts.items() if n}
        self._truncated[split] = cuts["max_seq_len"]
        for limit, n in self._cuts[split].items():
            what = cut_what(limit, per_limit)
            log.warning("%s/%s: %d of %d %s truncated at %s=%d", self.name, "input" if split == "__predict__" else split,
                        n, len(recs), what, limit, self.limit(limit))
        return feats

    def pack(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A padded batch of this task in packed rows where its codec packs and that computes fewer slots
        (training/packing.py), rows at most ``row_factor`` times the longest example this task's rows may
        have (a generation source may pass max_seq_len by its prefix; its targets are cut at
        max_target_len); else as it is."""
        from skillnet.training.packing import pack_where_it_pays

        kind = self.codec.packs
        if not kind:
            return tensors
        pairs = kind == "pairs"
        k = self.row_factor
        return pack_where_it_pays(
            tensors, self.tok.pad_id, row_len=k * max(self.max_len, tensors["input_ids"].shape[1]),
            unpack=kind == "tokens", decoder_start_id=self.tok.sep_id if pairs else None,
            decoder_row_len=k * max(self.limit("max_target_len"), tensors["labels"].shape[1]) if pairs else None)

    def limit(self, name: str) -> int:
        """The value of a length limit of this task (``max_seq_len``, ``max_target_len``)."""
        return self.max_len if name == "max_seq_len" else int(getattr(self.cfg, name))

    @property
    def truncated(self) -> dict[str, int]:
        """Examples of each loaded split that ``max_seq_len`` cuts: texts or pairs that lose tokens, NER
        sentences that lose words, span questions cut to a third of the window (long contexts are read
        through windows, which is not truncation), matching questions with a cut candidate pair, generation
        sources. What the model reads of its input: a generation target cut at ``max_target_len`` is not
        counted here (``cuts`` has both)."""
        for split in self.records:
            self.features(split)
        return {split: self._truncated[split] for split in self.records}

    @property
    def cuts(self) -> dict[str, dict[str, int]]:
        """{split: {limit: examples it cut}} of each loaded split, limits that cut nothing left out."""
        for split in self.records:
            self.features(split)
        return {split: dict(self._cuts[split]) for split in self.records}

    def encode_records(self, recs: list[dict[str, Any]]) -> list[Encoded]:
        """Encode records that did not come from a split (prediction files)."""
        key = "__predict__"
        self.records[key] = recs
        self._features.pop(key, None)
        try:
            return self.features(key)
        finally:
            self.records.pop(key, None)
            self._features.pop(key, None)
            self._truncated.pop(key, None)
            self._cuts.pop(key, None)

    # ------------------------------------------------------------------------------------ batches
    def num_train_rows(self) -> int:
        return self.codec.num_train_rows(self)

    def train_indices(self, seed: int, draw: int, batch_size: int) -> list[int]:
        """Indices of the `draw`-th training batch of this task (a fresh permutation per pass)."""
        n = self.num_train_rows()
        if n == 0:
            raise TaskDataError(self.files.get("train", self.name), 0, "no usable training example")
        out = []
        for pos in range(draw * batch_size, (draw + 1) * batch_size):
            epoch, k = divmod(pos, n)
            perm = self._perm(seed, epoch, n)
            out.append(int(perm[k]))
        return out

    def _perm(self, seed: int, epoch: int, n: int) -> np.ndarray:
        key = (seed, epoch)
        cache = getattr(self, "_perm_cache", None)
        if cache is None or cache[0] != key:
            rng = np.random.default_rng([seed, _stable_hash(self.name), epoch])
            self._perm_cache = (key, rng.permutation(n))
        return self._perm_cache[1]

    def train_batch(self, indices: Sequence[int], seed: int = 0, draw: int = 0) -> dict[str, torch.Tensor]:
        return self.codec.train_batch(self, indices, seed, draw)

    # ------------------------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def predict_split(self, model: Any, split: str, batch_size: int, progress: bool = False) -> list[Any]:
        """Model predictions for every record of `split`, in the label space of the task."""
        return self.predict_records(model, self.records[split], batch_size, split=split, progress=progress)

    @torch.no_grad()
    def predict_records(self, model: Any, recs: list[dict[str, Any]], batch_size: int, split: str | None = None,
                        progress: bool = False) -> list[Any]:
        was_training = model.training
        model.eval()
        try:
            return self.codec.predict(self, model, recs, split, batch_size, progress)
        finally:
            model.train(was_training)

    def decode_text(self, ids: Sequence[int]) -> str:
        """Generated ids -> text: special tokens dropped, word pieces joined, CJK characters without spaces
        (the vocab's lower-casing stays: metrics compare case-insensitively)."""
        special = {self.tok.pad_id, self.tok.cls_id, self.tok.sep_id, self.tok.mask_id}
        out: list[str] = []
        for i in ids:
            if i in special:
                continue
            piece = self.tok.vocab[i]
            if piece.startswith("##"):
                out.append(piece[2:])
            elif out and out[-1][-1:].isascii() and out[-1][-1:].isalnum() and piece[:1].isascii() and piece[:1].isalnum():
                out.append(" " + piece)  # two Latin words / numbers in a row
            else:
                out.append(piece)
        return "".join(out)

    def score(self, split: str, preds: list[Any]) -> dict[str, float]:
        return self.score_records(self.records[split], preds)

    def score_records(self, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, float]:
        return self.codec.score(self, recs, preds)

    def trivial_baseline(self, split: str) -> dict[str, float]:
        """Scores of the trivial predictor of the task type (``codec.trivial``): majority class of train
        (classification; all-O for NER), train mean (regression, correlations are 0), the context's first
        character (span), a copy of the source (generation), constant scores (matching: random choice)."""
        recs = self.records[split]
        return self.score_records(recs, self.codec.trivial(self, recs))

    def lexical_baseline(self, split: str, cut: bool = False) -> dict[str, float] | None:
        """Scores of the task type's non-neural baseline fit on train (``codec.lexical``: TF-IDF + logistic
        regression for classification, TF-IDF similarity for matching), or None where it has none. `cut`: fit
        and scored on the texts cut to what the model reads at max_seq_len (``codec.cut_for_model``), which says
        what the cut alone costs."""
        key = self._lexical_key(split, cut) if self.codec.lexical_name is not None else None
        if key is None:
            return self._lexical_scores(split, cut)
        if key not in _LEXICAL_SCORES:
            _LEXICAL_SCORES[key] = self._lexical_scores(split, cut)
        hit = _LEXICAL_SCORES[key]
        return None if hit is None else dict(hit)

    def _lexical_key(self, split: str, cut: bool) -> str | None:
        """What a lexical baseline's score depends on: the codec, the task's settings, its label list, the train
        and scored records, and where cut, the tokenizer that cuts them (None: a tokenizer without a
        fingerprint, never cached)."""
        fingerprint = getattr(self.tok, "fingerprint", None)
        if cut and fingerprint is None:
            return None
        settings = {f.name: getattr(self.cfg, f.name) for f in dataclasses.fields(self.cfg)
                    if f.name not in _NOT_LEXICAL}
        what = [type(self.codec).__qualname__, settings, self.kind, self.label_list, self.positive_label, split,
                self.records["train"], self.records[split], [self.max_len, fingerprint] if cut else None]
        return hashlib.sha256(json.dumps(what, sort_keys=True, default=str, ensure_ascii=False).encode()).hexdigest()

    def _lexical_scores(self, split: str, cut: bool) -> dict[str, float] | None:
        recs = self.records[split]
        if not cut:
            preds = self.codec.lexical(self, recs)
        else:
            seen, train = self.codec.cut_for_model(self, recs), self.codec.cut_for_model(self, self.records["train"])
            preds = None if seen is None or train is None else self.codec.lexical(self, seen, train=train)
        return None if preds is None else self.score_records(recs, preds)
