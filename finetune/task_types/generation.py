"""``generation``: sequence to sequence on SkillNet-BART (the shared LM head), decoded with beam search and
scored by ROUGE-L, BLEU and F0.5 (a task selected on F0.5 also reports the detection scores)."""

from __future__ import annotations

from typing import Any

import torch

from .base import Encoded, TaskCodec, TaskView, pad, piece_ids


class GenerationCodec(TaskCodec):
    name = "generation"
    head = None
    kinds = ("generation",)
    metrics = ("rouge_l", "bleu_2", "bleu_4", "f0.5")
    # Reported beside the metrics, never selected on: does the output depend on the input at all?
    diagnostics = ("distinct", "repetition", "char_accuracy")
    metric = "rouge_l"
    arch = "bart"
    shows_samples = True
    packs = "pairs"  # training rows; beam search at evaluation decodes one example per row
    decoder = True

    def meta(self, td: TaskView) -> dict[str, Any]:
        c = td.cfg
        return {"max_target_len": c.max_target_len, "prefix": c.source_prefix, "num_beams": c.num_beams,
                "lang": c.lang}

    def config_from_meta(self, meta: dict[str, Any]) -> dict[str, Any]:
        return {k: meta[k] for k in ("max_target_len", "prefix", "num_beams", "lang") if k in meta}

    def encode(self, td: TaskView, recs: list[dict[str, Any]], split: str) -> tuple[list[Encoded], int]:
        """Source: [CLS] prefix + source [SEP], the source cut to max_seq_len - 2 tokens (the prefix comes on
        top: it must not cut the source, or an aligned task such as csc would train on targets that keep
        characters the model never saw); labels: [CLS] target [SEP] (max_target_len), as the public
        SkillNet-NLG code; the decoder starts from [SEP] (the model config's decoder_start_token_id), so
        the labels' [CLS] is the first token it generates."""
        cls, sep, max_tgt = td.tok.cls_id, td.tok.sep_id, td.cfg.max_target_len
        prefix = td.cfg.source_prefix
        # Tokenised together (a prefix without a trailing space may merge with the source's first word);
        # the prefix's own token count says where the source starts.
        n_prefix = len(piece_ids(td.tok, [prefix])[0]) if prefix else 0
        max_len = td.max_len + n_prefix
        srcs = piece_ids(td.tok, [prefix + r["source"] for r in recs])
        tgts = (piece_ids(td.tok, [r["target"] for r in recs]) if all("target" in r for r in recs)
                else [None] * len(recs))
        feats = []
        for s_ids, t_ids in zip(srcs, tgts):
            s_cut = len(s_ids) > max_len - 2
            t_cut = t_ids is not None and len(t_ids) > max_tgt - 2
            e = Encoded([cls] + s_ids[: max_len - 2] + [sep], [0] * (min(len(s_ids), max_len - 2) + 2))
            if t_ids is not None:
                e.extra["labels"] = [cls] + t_ids[: max_tgt - 2] + [sep]
            e.extra["truncated"] = s_cut or t_cut
            # which limit cut what: the run reports source and target cuts apart (TaskData.cuts)
            e.extra["cuts"] = tuple(limit for limit, c in (("max_seq_len", s_cut), ("max_target_len", t_cut)) if c)
            feats.append(e)
        return feats, sum(f.extra["truncated"] for f in feats)

    def collate(self, td: TaskView, feats: list[Encoded], with_labels: bool) -> dict[str, torch.Tensor]:
        # BART takes no token types
        batch = {"input_ids": pad([f.input_ids for f in feats], td.tok.pad_id),
                 "attention_mask": pad([[1] * len(f.input_ids) for f in feats], 0)}
        if with_labels:
            batch["labels"] = pad([f.extra["labels"] for f in feats], -100)
        return batch

    def decode(self, td: TaskView, model: Any, feats: list[Encoded], batch: dict[str, torch.Tensor]) -> list[Any]:
        # [UNK] is never a right character (it stands for all the characters outside the vocab at once),
        # yet it is often a small model's most likely token: decoding picks the best real one instead.
        out = model.generate(**batch, task=td.name, num_beams=td.cfg.num_beams, max_new_tokens=td.cfg.max_target_len,
                             suppress_tokens=[td.tok.unk_id])
        return [td.decode_text(row) for row in out.tolist()]

    def score(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, float]:
        from .. import gen_metrics

        # A corrector (a task selected on edit F0.5: csc) also says whether it finds the wrong characters,
        # whatever it writes there: a model can learn where before it learns what, and F0.5 alone cannot show it.
        detection = gen_metrics.DETECTION_METRICS if td.cfg.metric in gen_metrics.CORRECTION_METRICS else ()
        return gen_metrics.score_generation([*self.metrics, *self.diagnostics, *detection],
                                            [r["source"] for r in recs], preds, [r["target"] for r in recs],
                                            lang=td.cfg.lang, lowercase=True)

    def trivial(self, td: TaskView, recs: list[dict[str, Any]]) -> list[Any]:
        """Copy the source: F0.5 = 0 (no edit), a real floor for overlap metrics."""
        return [r["source"] for r in recs]

    def sample(self, rec: dict[str, Any], pred: Any) -> dict[str, Any]:
        return {"source": rec["source"], "reference": rec["target"], "output": pred}
