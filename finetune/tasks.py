"""Task data for fine-tuning: loading (via data_prep.tasks), tokenisation into features, batching,
decoding and scoring, one class per task.

Chinese text with the bert-base-chinese vocab is tokenised one character per token, so NER tags and
answer spans align to characters; the code nevertheless works from the tokenizer's offsets and word
ids, so word pieces (Latin words, numbers) are handled too:

* tagging: each word (``tokens[i]``) becomes its word pieces; the first piece carries the tag (the
  CRF sees only first pieces, via ``word_mask``); a word with no piece becomes ``[UNK]``; words past
  ``max_seq_len`` are predicted ``O`` (and still count in the metric).
* span: ``[CLS] question [SEP] context-window [SEP]``; the context is cut into windows of
  ``max_seq_len`` with a stride of half a window. Training uses the window that holds the answer
  (examples whose answer fits no window are skipped and counted); evaluation scores the best span over
  all windows and maps it back to characters of the context.
* choice (matching): each group is ``[question, candidate]`` pairs ``[G, C, T]``. Training draws the
  positive and ``num_negatives`` negatives per group; evaluation scores every candidate (capped by
  ``max_candidates``).

Batches are deterministic in ``(seed, task, draw)``: the order of a task's examples is a permutation
per pass over the data, seeded by ``(seed, task, pass)``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from skillnet.data_prep.tasks.schema import (
    LoadReport,
    TaskDataError,
    TaskSpec,
    dataset_splits,
    infer_pair_kind,
    load_task_file,
)

from . import metrics as M
from .config import METRICS_OF_TYPE, TASK_TYPES, FinetuneConfig, TaskConfig

log = logging.getLogger("finetune")


def _stable_hash(s: str) -> int:
    return int.from_bytes(hashlib.sha256(s.encode()).digest()[:4], "little")


@dataclass
class Encoded:
    """One model input row (lists of ints) plus what decoding needs."""

    input_ids: list[int]
    token_type_ids: list[int]
    extra: dict[str, Any] = field(default_factory=dict)


class TaskData:
    """Everything about one task's data: records, label list, features, batches, scoring."""

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
        self.regression = cfg.type == "regression"
        if ft is not None:
            self._collect_sources(ft)
        self.kind_note = ""  # how the kind was inferred, for error messages
        if self.kind is None:
            self.kind = self._infer_kind(load_splits)
        self.records: dict[str, list[dict[str, Any]]] = {}
        self.reports: dict[str, LoadReport] = {}
        self.skipped_windows = 0
        self._truncated: dict[str, int] = {}
        for split in load_splits:
            if split in self.sources:
                self._load(split, skip_bad)
        if "train" in load_splits and "train" not in self.records:
            raise TaskDataError(f"<config task {self.name!r}>", 0, "no training data (give 'train', a 'dataset' with a "
                                "train split, or a spec with one)")
        self._features: dict[str, list[Encoded]] = {}
        if load_splits and cfg.type in ("classification", "ner") and self.num_labels < 2:
            raise TaskDataError(self.files.get("train", self.name), 0,
                                f"task {self.name!r} needs at least 2 labels, found {self.label_list}; "
                                "list them under 'labels' in the config")
        self.positive_label = self._positive_label() if load_splits else cfg.positive_label

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

    def _infer_kind(self, load_splits: Sequence[str]) -> str:
        """A classification/regression task's kind from its train records (``pair`` if they carry a
        ``text_pair``), so a pair task given as plain files is never trained on its first texts alone."""
        t = self.cfg.type
        if t in ("classification", "regression") and "train" in self.sources and load_splits:
            kind, where = infer_pair_kind(self.sources["train"], columns=self.cfg.columns or None,
                                          name=self.files["train"], split="train")
            if where is not None:
                self.kind_note = (f" (kind 'pair' inferred from {where}, the first record "
                                  "with a 'text_pair'; set 'kind' in the config to choose)")
            return kind
        return TASK_TYPES[t]["kinds"][0]

    def _positive_label(self) -> str | None:
        """The class whose F1 is the ``f1`` metric of a binary classification task (None otherwise)."""
        if self.cfg.type != "classification":
            return None
        labels = list(self.label_list or [])
        pos = self.cfg.positive_label
        where = self.files.get("train", self.name)
        if pos is not None and pos not in labels:
            raise TaskDataError(where, 0, f"task {self.name!r}: positive_label {pos!r} is not one of the labels "
                                f"{labels}")
        if len(labels) == 2 and pos is None and "1" in labels:
            pos = "1"
        if self.cfg.metric == "f1" and (len(labels) != 2 or pos is None):
            raise TaskDataError(where, 0, f"task {self.name!r}: metric 'f1' is the positive-class F1 of a binary "
                                f"task; it has {len(labels)} labels {labels}" + (
                                    "" if len(labels) != 2 else " and no 'positive_label' (the default '1' is "
                                    "not a label)"))
        return pos if len(labels) == 2 else None

    @classmethod
    def for_inference(cls, name: str, meta: dict[str, Any], tokenizer: Any) -> TaskData:
        """A data-less TaskData from the metadata an export carries (``finetune_tasks.json``)."""
        gen = {k: meta[k] for k in ("max_target_len", "prefix", "num_beams", "lang") if k in meta}
        cfg = TaskConfig(name=name, type=meta["type"], skills=list(meta.get("skills") or ["s7"]),
                         train="(not needed for prediction)", kind=meta["kind"], labels=meta.get("labels"),
                         head=dict(meta.get("head") or {}), max_seq_len=int(meta["max_seq_len"]), **gen)
        return cls(cfg, None, tokenizer, load_splits=())

    def meta(self) -> dict[str, Any]:
        """What prediction needs to encode inputs and decode outputs of this task."""
        meta = {"type": self.cfg.type, "kind": self.kind, "labels": self.label_list, "skills": self.cfg.skills,
                "max_seq_len": self.max_len, "head": self.cfg.head, "metric": self.cfg.metric}
        if self.cfg.type == "generation":
            meta.update(max_target_len=self.cfg.max_target_len, prefix=self.cfg.source_prefix,
                        num_beams=self.cfg.num_beams, lang=self.cfg.lang)
        return meta

    # ------------------------------------------------------------------------------------ loading
    def _load(self, split: str, skip_bad: bool) -> None:
        cap = self.cfg.max_train_examples if split == "train" else self.cfg.max_eval_examples
        labels = self.label_list
        try:
            recs, report = load_task_file(self.sources[split], self.kind, labels, skip_bad,
                                          regression=self.regression, as_dataset=False,
                                          columns=self.cfg.columns or None, name=self.files[split], split=split)
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

    @property
    def num_train(self) -> int:
        return len(self.records.get("train", []))

    @property
    def num_labels(self) -> int:
        if self.cfg.type in ("classification", "ner"):
            return len(self.label_list or [])
        return 1

    def head_spec(self) -> dict[str, Any]:
        spec = {"type": self.cfg.head_type, "num_labels": max(self.num_labels, 1), **self.cfg.head}
        if self.cfg.type in ("classification", "ner"):
            spec["labels"] = list(self.label_list or [])
        if self.cfg.type == "regression":
            spec["regression"] = True
        return spec

    # ------------------------------------------------------------------------------------ encoding
    def _pieces(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        encs = self.tok.backend.encode_batch(list(texts), add_special_tokens=False)
        return [(e.ids, e.offsets) for e in encs]

    def _pair(self, a: list[int], b: list[int] | None, max_len: int) -> Encoded:
        a, b = list(a), list(b) if b is not None else None
        budget = max_len - (3 if b is not None else 2)
        cut = len(a) + (len(b) if b else 0) > budget
        # Longest-first truncation, as BERT's run_classifier.
        while len(a) + (len(b) if b else 0) > budget:
            if b and len(b) >= len(a):
                b.pop()
            else:
                a.pop()
        cls, sep = self.tok.cls_id, self.tok.sep_id
        ids = [cls] + a + [sep]
        tt = [0] * len(ids)
        if b is not None:
            ids += b + [sep]
            tt += [1] * (len(b) + 1)
        return Encoded(ids, tt, {"truncated": cut})

    def features(self, split: str) -> list[Encoded]:
        """Encoded rows of `split` (cached). Matching groups are encoded per batch instead."""
        if split in self._features:
            return self._features[split]
        recs = self.records[split]
        t = self.cfg.type
        if t in ("classification", "regression"):
            a = [ids for ids, _ in self._pieces([r["text"] for r in recs])]
            b = ([ids for ids, _ in self._pieces([r["text_pair"] for r in recs])] if self.kind == "pair"
                 else [None] * len(recs))
            feats = []
            for r, ia, ib in zip(recs, a, b):
                e = self._pair(ia, ib, self.max_len)
                e.extra["label"] = r["label"] if self.regression else r.get("label_id", -1)
                feats.append(e)
            truncated = sum(f.extra["truncated"] for f in feats)
        elif t == "ner":
            feats = [self._encode_tagging(r) for r in recs]
            truncated = sum(f.extra["n_words"] < f.extra["n_total"] for f in feats)
        elif t == "span":
            feats, truncated = self._encode_span(recs, train=(split == "train"))
        elif t == "generation":
            feats = self._encode_generation(recs)
            truncated = sum(f.extra["truncated"] for f in feats)
        else:
            feats = []  # matching: per batch
            truncated = self._count_truncated_groups(recs, split)
        self._features[split] = feats
        self._truncated[split] = int(truncated)
        if truncated:
            log.warning("%s/%s: %d of %d examples truncated at max_seq_len=%d", self.name,
                        "input" if split == "__predict__" else split, truncated, len(recs), self.max_len)
        return feats

    @property
    def truncated(self) -> dict[str, int]:
        """Examples of each loaded split that ``max_seq_len`` cuts: texts or pairs that lose tokens, NER
        sentences that lose words, span questions cut to a third of the window (long contexts are read
        through windows, which is not truncation), matching questions with a cut candidate pair."""
        for split in self.records:
            self.features(split)
        return {split: self._truncated[split] for split in self.records}

    def _count_truncated_groups(self, recs: list[dict[str, Any]], split: str) -> int:
        cands = [r["candidates"] if split == "train" else [r["candidates"][i] for i in self.eval_candidates(r)]
                 for r in recs]
        q_len = [len(ids) for ids, _ in self._pieces([r["question"] for r in recs])]
        c_len = [len(ids) for ids, _ in self._pieces([c for cs in cands for c in cs])]
        n, k = 0, 0
        for q, cs in zip(q_len, cands):
            n += any(q + c_len[k + j] > self.max_len - 3 for j in range(len(cs)))
            k += len(cs)
        return n

    def _encode_tagging(self, r: dict[str, Any]) -> Encoded:
        words = r["tokens"]
        pieces = [ids for ids, _ in self._pieces(words)]
        ids, tt, wmask, labs = [self.tok.cls_id], [0], [0], [-100]
        label_ids = r.get("label_ids")
        n_words = 0
        for i, p in enumerate(pieces):
            p = p or [self.tok.unk_id]
            if len(ids) + len(p) > self.max_len - 1:
                break
            ids += p
            tt += [0] * len(p)
            wmask += [1] + [0] * (len(p) - 1)
            lab = label_ids[i] if label_ids is not None else 0
            labs += [lab] + [-100] * (len(p) - 1)
            n_words += 1
        ids.append(self.tok.sep_id)
        tt.append(0)
        wmask.append(0)
        labs.append(-100)
        return Encoded(ids, tt, {"word_mask": wmask, "labels": labs, "n_words": n_words, "n_total": len(words)})

    def _encode_span(self, recs: list[dict[str, Any]], train: bool) -> tuple[list[Encoded], int]:
        """Window features and the number of examples whose question was cut."""
        qs = self._pieces([r["question"] for r in recs])
        cs = self._pieces([r["context"] for r in recs])
        feats: list[Encoded] = []
        q_budget = max(1, self.max_len // 3)
        cut_questions = sum(len(q_ids) > q_budget for q_ids, _ in qs)
        for ex_i, (r, (q_ids, _), (c_ids, c_off)) in enumerate(zip(recs, qs, cs)):
            q_ids = q_ids[:q_budget]
            win = self.max_len - len(q_ids) - 3
            stride = max(1, win // 2)
            starts = list(range(0, max(1, len(c_ids) - win + stride), stride)) or [0]
            ans_tok: tuple[int, int] | None = None
            if train and r["answers"]:
                a = r["answers"][0]
                cs_, ce_ = a["start"], a["start"] + len(a["text"])
                toks = [k for k, (s, e) in enumerate(c_off) if e > cs_ and s < ce_]
                if toks:
                    ans_tok = (toks[0], toks[-1])
            for w0 in starts:
                w1 = min(len(c_ids), w0 + win)
                base = len(q_ids) + 2
                e = self._pair(q_ids, c_ids[w0:w1], self.max_len)
                cmask = [0] * base + [1] * (w1 - w0) + [0]
                extra = {"context_mask": cmask, "example": ex_i, "offsets": c_off[w0:w1], "base": base}
                if train:
                    if ans_tok is None or not (w0 <= ans_tok[0] and ans_tok[1] < w1):
                        continue
                    extra["start"] = ans_tok[0] - w0 + base
                    extra["end"] = ans_tok[1] - w0 + base
                e.extra.update(extra)
                feats.append(e)
                if train:
                    break  # one window per training example
            else:
                if train:
                    self.skipped_windows += 1
        if train and self.skipped_windows:
            log.warning("%s: %d training examples skipped: answer not inside any %d-token window",
                        self.name, self.skipped_windows, self.max_len)
        return feats, cut_questions

    def _encode_generation(self, recs: list[dict[str, Any]]) -> list[Encoded]:
        """Source: [CLS] prefix + source [SEP] (max_seq_len); labels: [CLS] target [SEP] (max_target_len), as
        the public SkillNet-NLG code; the decoder starts from [SEP] (the model config's
        decoder_start_token_id), so the labels' [CLS] is the first token it generates."""
        cls, sep = self.tok.cls_id, self.tok.sep_id
        srcs = [ids for ids, _ in self._pieces([self.cfg.source_prefix + r["source"] for r in recs])]
        tgts = ([ids for ids, _ in self._pieces([r["target"] for r in recs])] if all("target" in r for r in recs)
                else [None] * len(recs))
        feats = []
        for s_ids, t_ids in zip(srcs, tgts):
            cut = len(s_ids) > self.max_len - 2
            e = Encoded([cls] + s_ids[: self.max_len - 2] + [sep], [0] * (min(len(s_ids), self.max_len - 2) + 2))
            if t_ids is not None:
                cut = cut or len(t_ids) > self.cfg.max_target_len - 2
                e.extra["labels"] = [cls] + t_ids[: self.cfg.max_target_len - 2] + [sep]
            e.extra["truncated"] = cut
            feats.append(e)
        return feats

    # ------------------------------------------------------------------------------------ batches
    def num_train_rows(self) -> int:
        return len(self.records["train"]) if self.cfg.type == "matching" else len(self.features("train"))

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
        if self.cfg.type == "matching":
            rng = np.random.default_rng([seed, _stable_hash(self.name), 1_000_003, draw])
            return self._matching_train_batch([self.records["train"][i] for i in indices], rng)
        feats = self.features("train")
        return self._collate([feats[i] for i in indices], with_labels=True)

    def _pad(self, rows: list[list[int]], value: int) -> torch.Tensor:
        T = max(len(r) for r in rows)
        return torch.tensor([r + [value] * (T - len(r)) for r in rows], dtype=torch.long)

    def _collate(self, feats: list[Encoded], with_labels: bool) -> dict[str, torch.Tensor]:
        ids = self._pad([f.input_ids for f in feats], self.tok.pad_id)
        if self.cfg.type == "generation":  # BART takes no token types
            batch = {"input_ids": ids, "attention_mask": self._pad([[1] * len(f.input_ids) for f in feats], 0)}
            if with_labels:
                batch["labels"] = self._pad([f.extra["labels"] for f in feats], -100)
            return batch
        batch = {
            "input_ids": ids,
            "token_type_ids": self._pad([f.token_type_ids for f in feats], 0),
            "attention_mask": self._pad([[1] * len(f.input_ids) for f in feats], 0),
        }
        t = self.cfg.type
        if t == "ner":
            batch["word_mask"] = self._pad([f.extra["word_mask"] for f in feats], 0)
            if with_labels:
                batch["labels"] = self._pad([f.extra["labels"] for f in feats], -100)
        elif t == "span":
            batch["context_mask"] = self._pad([f.extra["context_mask"] for f in feats], 0)
            if with_labels:
                batch["start_positions"] = torch.tensor([f.extra["start"] for f in feats], dtype=torch.long)
                batch["end_positions"] = torch.tensor([f.extra["end"] for f in feats], dtype=torch.long)
        elif with_labels and t == "regression":
            batch["labels"] = torch.tensor([float(f.extra["label"]) for f in feats], dtype=torch.float32)
        elif with_labels and t == "classification":
            batch["labels"] = torch.tensor([int(f.extra["label"]) for f in feats], dtype=torch.long)
        return batch

    def _group_tensors(self, groups: list[list[tuple[str, str]]]) -> dict[str, torch.Tensor]:
        flat = [p for g in groups for p in g]
        qa = self._pieces([q for q, _ in flat])
        ca = self._pieces([c for _, c in flat])
        encs = [self._pair(q, c, self.max_len) for (q, _), (c, _) in zip(qa, ca)]
        G, C = len(groups), max(len(g) for g in groups)
        T = max(len(e.input_ids) for e in encs)
        ids = torch.full((G, C, T), self.tok.pad_id, dtype=torch.long)
        tt = torch.zeros((G, C, T), dtype=torch.long)
        am = torch.zeros((G, C, T), dtype=torch.long)
        cm = torch.zeros((G, C), dtype=torch.long)
        k = 0
        for gi, g in enumerate(groups):
            for ci in range(len(g)):
                e = encs[k]
                k += 1
                n = len(e.input_ids)
                ids[gi, ci, :n] = torch.tensor(e.input_ids)
                tt[gi, ci, :n] = torch.tensor(e.token_type_ids)
                am[gi, ci, :n] = 1
                cm[gi, ci] = 1
        # An all-padding candidate row would attend to nothing; give it its [CLS] so softmax stays finite.
        am[..., 0] = 1
        out = {"input_ids": ids, "token_type_ids": tt, "attention_mask": am}
        if int(cm.sum()) != G * C:
            out["candidate_mask"] = cm
        return out

    def _matching_train_batch(self, recs: list[dict[str, Any]], rng: np.random.Generator) -> dict[str, torch.Tensor]:
        groups, labels = [], []
        k_neg = self.cfg.num_negatives
        for r in recs:
            cands, pos = r["candidates"], r["positives"]
            p = int(pos[rng.integers(len(pos))])
            negs = [i for i in range(len(cands)) if i not in set(pos)]
            chosen = [int(x) for x in rng.choice(len(negs), size=min(k_neg, len(negs)), replace=False)] if negs else []
            items = [p] + [negs[j] for j in chosen]
            order = rng.permutation(len(items))
            items = [items[j] for j in order]
            labels.append(int(np.where(order == 0)[0][0]))
            groups.append([(r["question"], cands[i]) for i in items])
        batch = self._group_tensors(groups)
        batch["labels"] = torch.tensor(labels, dtype=torch.long)
        return batch

    # ------------------------------------------------------------------------------------ evaluation
    def eval_candidates(self, r: dict[str, Any]) -> list[int]:
        """Candidate indices scored at evaluation: all, or the positives plus the first negatives up to
        `head.max_candidates` (a fixed subset so the random baseline is 1/k)."""
        cap = int(self.cfg.head.get("max_candidates", 0) or 0)
        n = len(r["candidates"])
        if not cap or n <= cap:
            return list(range(n))
        pos = list(r["positives"])
        negs = [i for i in range(n) if i not in set(pos)][: max(0, cap - len(pos))]
        return sorted(pos + negs)

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
            return self._predict(model, recs, batch_size, split, progress)
        finally:
            model.train(was_training)

    def _iter_chunks(self, n: int, bs: int, progress: bool, desc: str) -> Iterator[range]:
        starts = range(0, n, bs)
        if progress:
            from tqdm import tqdm

            starts = tqdm(starts, desc=desc, unit="batch", leave=False)
        for s in starts:
            yield range(s, min(n, s + bs))

    def _predict(self, model: Any, recs: list[dict[str, Any]], bs: int, split: str | None,
                 progress: bool) -> list[Any]:
        t = self.cfg.type
        device = next(model.parameters()).device
        to = lambda b: {k: v.to(device) for k, v in b.items()}  # noqa: E731
        if t == "matching":
            # Pairs of all records in one flat list, scored bs at a time as one pseudo-group [1, n, T]
            # (the head scores each row independently; the softmax only matters for the loss).
            cands = [self.eval_candidates(r) for r in recs]
            flat = [(ri, c) for ri, cs in enumerate(cands) for c in cs]
            flat_scores: list[float] = []
            for chunk in self._iter_chunks(len(flat), bs, progress, self.name):
                pairs = [[(recs[flat[j][0]]["question"], recs[flat[j][0]]["candidates"][flat[j][1]]) for j in chunk]]
                out = model(task=self.name, **to(self._group_tensors(pairs)))
                flat_scores += out.logits.view(-1).float().tolist()
            per: list[list[float]] = [[] for _ in recs]
            for (ri, _), sc in zip(flat, flat_scores):
                per[ri].append(sc)
            return [{"candidates": c, "scores": s} for c, s in zip(cands, per)]
        if split is not None:
            feats = self.features(split)
        else:
            feats = self._encode_records(recs)
        preds: list[Any] = []
        if t == "generation":
            for chunk in self._iter_chunks(len(feats), bs, progress, self.name):
                batch = to(self._collate([feats[i] for i in chunk], with_labels=False))
                out = model.generate(**batch, task=self.name, num_beams=self.cfg.num_beams,
                                     max_new_tokens=self.cfg.max_target_len)
                preds += [self.decode_text(row) for row in out.tolist()]
            return preds
        if t == "span":
            best: dict[int, tuple[float, str]] = {}
            for chunk in self._iter_chunks(len(feats), bs, progress, self.name):
                fs = [feats[i] for i in chunk]
                out = model(task=self.name, **to(self._collate(fs, with_labels=False)))
                for f, sp in zip(fs, self._best_spans(model, out.logits)):
                    score, (ts, te) = sp
                    off = f.extra["offsets"]
                    a, b = ts - f.extra["base"], te - f.extra["base"]
                    if not (0 <= a < len(off) and 0 <= b < len(off)):
                        continue
                    ctx = recs[f.extra["example"]]["context"]
                    text = ctx[off[a][0]:off[b][1]]
                    ex = f.extra["example"]
                    if ex not in best or score > best[ex][0]:
                        best[ex] = (score, text)
            return [best.get(i, (0.0, ""))[1] for i in range(len(recs))]
        for chunk in self._iter_chunks(len(feats), bs, progress, self.name):
            fs = [feats[i] for i in chunk]
            batch = to(self._collate(fs, with_labels=False))
            p = model.predict(self.name, **batch)
            if t == "classification":
                preds += [self.label_list[int(i)] for i in p]
            elif t == "regression":
                preds += [float(x) for x in p]
            else:  # ner: tag ids per word; words cut by max_seq_len are O
                for f, tags in zip(fs, p):
                    labs = [self.label_list[int(i)] for i in tags]
                    preds.append(labs + ["O"] * (f.extra["n_total"] - len(labs)))
        return preds

    def _best_spans(self, model: Any, logits_BT2: torch.Tensor) -> list[tuple[float, tuple[int, int]]]:
        max_len = int(getattr(model.heads[self.name], "max_answer_len", 64))
        s, e = logits_BT2.float().log_softmax(1).unbind(-1)
        score = s[:, :, None] + e[:, None, :]
        T = score.shape[1]
        i = torch.arange(T)
        ok = (i[None, :] >= i[:, None]) & (i[None, :] - i[:, None] < max_len)
        flat = score.masked_fill(~ok, float("-inf")).flatten(1)
        val, arg = flat.max(1)
        return [(float(v), (int(a) // T, int(a) % T)) for v, a in zip(val, arg)]

    def _encode_records(self, recs: list[dict[str, Any]]) -> list[Encoded]:
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
        t = self.cfg.type
        if t == "classification":
            gold = [r["label"] for r in recs]
            # macro-F1 over the classes present in gold or predictions (scikit-learn's default): a class
            # absent from a small dev set would otherwise count as F1 = 0.
            out = {"accuracy": M.accuracy(gold, preds), "macro_f1": M.macro_f1(gold, preds)}
            if self.positive_label is not None:
                out["f1"] = M.binary_f1(gold, preds, self.positive_label)
            return out
        if t == "regression":
            gold = [float(r["label"]) for r in recs]
            return {"pearson": M.pearson(gold, preds), "spearman": M.spearman(gold, preds)}
        if t == "ner":
            return M.entity_prf([r["labels"] for r in recs], preds)
        if t == "span":
            golds = [[a["text"] for a in r["answers"]] for r in recs]
            bag = M.span_char_bag_em_f1(golds, preds)
            return {**M.cmrc2018_em_f1(golds, preds), "char_bag_em": bag["em"], "char_bag_f1": bag["f1"]}
        if t == "generation":
            from . import gen_metrics

            return gen_metrics.score_generation(list(METRICS_OF_TYPE["generation"]), [r["source"] for r in recs],
                                                preds, [r["target"] for r in recs], lang=self.cfg.lang,
                                                lowercase=True)
        gids, scores, labels = [], [], []
        for gi, (r, p) in enumerate(zip(recs, preds)):
            pos = set(r["positives"])
            for c, s in zip(p["candidates"], p["scores"]):
                gids.append(gi)
                scores.append(s)
                labels.append(int(c in pos))
        res = M.group_top1_accuracy(gids, scores, labels)
        return {"top1_accuracy": res["top1_accuracy"]}

    def trivial_baseline(self, split: str) -> dict[str, float]:
        """Scores of the trivial predictor: majority class of train (classification/NER all-O),
        train mean (regression, correlations are 0), the first/longest-free empty span, random candidate."""
        recs = self.records[split]
        t = self.cfg.type
        if t == "classification":
            from collections import Counter

            major = Counter(r["label"] for r in self.records["train"]).most_common(1)[0][0]
            return self.score_records(recs, [major] * len(recs))
        if t == "regression":
            mean = float(np.mean([r["label"] for r in self.records["train"]]))
            return self.score_records(recs, [mean] * len(recs))
        if t == "ner":
            return self.score_records(recs, [["O"] * len(r["tokens"]) for r in recs])
        if t == "span":
            return self.score_records(recs, [r["context"][:1] for r in recs])
        if t == "generation":  # copy the source: F0.5 = 0 (no edit), a real floor for overlap metrics
            return self.score_records(recs, [r["source"] for r in recs])
        # constant scores: the tie rule of group_top1_accuracy gives the random-choice expectation
        return self.score_records(recs, [{"candidates": self.eval_candidates(r),
                                          "scores": [0.0] * len(self.eval_candidates(r))} for r in recs])
