"""A deterministic synthetic MLM/NSP corpus with the ``PretrainingDataset`` interface.

For smoke tests, the multi-rank CI tests and ``bench/pretrain.py``: no files, learnable structure
(each sample has a topic; tokens follow a Zipf law over the topic's own small vocabulary; an NSP
"next" segment shares the topic, a "random" one does not), deterministic in (seed, epoch, index, objective).
Real runs use ``pretrain.dataset.PretrainingDataset`` on shards built by ``python -m skillnet.data_prep build``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["SyntheticPretrainingDataset"]

_OBJ_ID = {"mlm": 1, "nsp": 2}


class SyntheticPretrainingDataset:
    pad_id, unk_id, cls_id, sep_id, mask_id = 0, 100, 101, 102, 103
    first_normal_id = 104

    def __init__(
        self,
        num_samples: int = 4096,
        vocab_size: int = 21128,
        max_seq_len: int = 64,
        seed: int = 0,
        mlm_probability: float = 0.15,
        num_topics: int = 16,
        topic_vocab: int = 48,
    ) -> None:
        if vocab_size < self.first_normal_id + num_topics * topic_vocab:
            raise ValueError(
                f"vocab_size {vocab_size} too small for {num_topics} topics x {topic_vocab} tokens"
            )
        if max_seq_len < 8:
            raise ValueError("max_seq_len must be >= 8")
        self.num_samples = num_samples
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.seed = seed
        self.mlm_probability = mlm_probability
        self.num_topics = num_topics
        self.topic_vocab = topic_vocab
        ranks = np.arange(1, topic_vocab + 1, dtype=np.float64)
        self._zipf = (1.0 / ranks) / (1.0 / ranks).sum()

    def _segment(self, rng: np.random.Generator, topic: int, n: int) -> np.ndarray:
        local = rng.choice(self.topic_vocab, size=n, p=self._zipf)
        return self.first_normal_id + topic * self.topic_vocab + local

    def _sample(self, index: int, epoch: int, objective: str) -> tuple[list[int], list[int], int]:
        if objective not in _OBJ_ID:
            raise ValueError(f"objective must be 'mlm' or 'nsp', got {objective!r}")
        rng = np.random.default_rng([self.seed, epoch, index, _OBJ_ID[objective]])
        topic = index % self.num_topics
        budget = self.max_seq_len - 3
        total = int(rng.integers(budget // 2, budget + 1))
        len_a = max(1, total // 2)
        len_b = max(1, total - len_a)
        is_random = int(rng.random() < 0.5) if objective == "nsp" else 0
        topic_b = (
            (topic + 1 + int(rng.integers(self.num_topics - 1))) % self.num_topics if is_random else topic
        )
        a = self._segment(rng, topic, len_a)
        b = self._segment(rng, topic_b, len_b)
        ids = [self.cls_id, *a.tolist(), self.sep_id, *b.tolist(), self.sep_id]
        types = [0] * (len_a + 2) + [1] * (len_b + 1)
        return ids, types, is_random

    def batch(self, indices: Sequence[int], epoch: int, objective: str) -> dict[str, torch.Tensor]:
        B, T = len(indices), self.max_seq_len
        input_ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        token_type_ids = torch.zeros((B, T), dtype=torch.long)
        attention_mask = torch.zeros((B, T), dtype=torch.long)
        labels = torch.full((B, T), -100, dtype=torch.long)
        nsp = torch.zeros(B, dtype=torch.long)
        for row, idx in enumerate(indices):
            ids, types, is_random = self._sample(int(idx), epoch, objective)
            n = len(ids)
            ids_t = torch.tensor(ids)
            if objective == "mlm":
                rng = np.random.default_rng([self.seed, epoch, int(idx), 99])
                special = np.isin(np.array(ids), [self.cls_id, self.sep_id])
                pick = (rng.random(n) < self.mlm_probability) & ~special
                if not pick.any():
                    cand = np.flatnonzero(~special)
                    pick[cand[rng.integers(len(cand))]] = True
                r = rng.random(n)
                rand_tok = rng.integers(self.first_normal_id, self.vocab_size, size=n)
                labels[row, :n] = torch.where(torch.from_numpy(pick), ids_t, torch.tensor(-100))
                new = np.array(ids)
                new[pick & (r < 0.8)] = self.mask_id
                swap = pick & (r >= 0.8) & (r < 0.9)
                new[swap] = rand_tok[swap]
                ids_t = torch.from_numpy(new)
            input_ids[row, :n] = ids_t
            token_type_ids[row, :n] = torch.tensor(types)
            attention_mask[row, :n] = 1
            nsp[row] = is_random
        out = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
        if objective == "mlm":
            out["labels"] = labels
        else:
            out["next_sentence_label"] = nsp
        return out
