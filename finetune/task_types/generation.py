"""``generation``: sequence to sequence on SkillNet-BART (the shared LM head), decoded with beam search and
scored by ROUGE-L, BLEU and F0.5 (a task selected on F0.5 also reports the detection scores)."""

from __future__ import annotations

from typing import Any

import torch

from .base import Encoded, TaskCodec, TaskView, pad, piece_ids, pieces


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
        texts = [prefix + r["source"] for r in recs]
        srcs = [ids for ids, _ in pieces(td.tok, texts)]
        tgts = (piece_ids(td.tok, [r["target"] for r in recs]) if all("target" in r for r in recs)
                else [None] * len(recs))
        feats = []
        for text, s_ids, t_ids in zip(texts, srcs, tgts):
            s_cut = len(s_ids) > max_len - 2
            t_cut = t_ids is not None and len(t_ids) > max_tgt - 2
            e = Encoded([cls] + s_ids[: max_len - 2] + [sep], [0] * (min(len(s_ids), max_len - 2) + 2))
            if t_ids is not None:
                e.extra["labels"] = [cls] + t_ids[: max_tgt - 2] + [sep]
            e.extra["truncated"] = s_cut or t_cut
            e.extra["unk_text"] = unk_texts(td, text, n_prefix, max_len - 2)
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
        """Beam search per row. [UNK] stands for every character outside the vocab at once, and it is often a
        small model's most likely token: a row whose source reads no [UNK] never writes one (it could name no
        character). A row whose source does may write it, and an [UNK] aligned to one of the source's is read
        as that source text: a corrector that keeps a character outside the vocab then copies it, where
        suppressing [UNK] forced it to write some other character there, an edit nobody asked for."""
        unk = td.tok.unk_id
        # the source's own [UNK]s (a prefix's, where the vocab lacks its characters, are nothing to copy)
        texts: list[dict[int, str]] = [f.extra.get("unk_text") or {} for f in feats] or [{} for _ in batch["input_ids"]]
        may_copy = [bool(x) for x in texts]
        rows: list[list[int]] = [[] for _ in may_copy]
        for copy in (False, True):  # one search per kind of row: the suppressed tokens are one list per call
            idx = [i for i, c in enumerate(may_copy) if c == copy]
            if not idx:
                continue
            sub = batch if len(idx) == len(may_copy) else {k: v[idx] for k, v in batch.items()}
            out = model.generate(**sub, task=td.name, num_beams=td.cfg.num_beams,
                                 max_new_tokens=td.cfg.max_target_len, suppress_tokens=[] if copy else [unk])
            for i, row in zip(idx, out.tolist()):
                rows[i] = row
        sources = [ids[mask.bool()].tolist() for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]
        return [td.decode_text(row) if unk not in row else copied_text(td, sources[i], row, texts[i])
                for i, row in enumerate(rows)]

    def score(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, float]:
        from .. import gen_metrics

        # A corrector (a task selected on edit F0.5: csc) also says whether it finds the wrong characters,
        # whatever it writes there: a model can learn where before it learns what, and F0.5 alone cannot show it.
        detection = ((*gen_metrics.DETECTION_METRICS, *gen_metrics.SENTENCE_METRICS)
                     if td.cfg.metric in gen_metrics.CORRECTION_METRICS else ())
        return gen_metrics.score_generation([*self.metrics, *self.diagnostics, *detection],
                                            [r["source"] for r in recs], preds, [r["target"] for r in recs],
                                            lang=td.cfg.lang, lowercase=True)

    def example_stats(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, Any] | None:
        """rouge_l: [the sentence's ROUGE-L F1, 1] (a mean over sentences); bleu_n: sacrebleu's segment counts
        (corpus BLEU is the score of their sums); f0.5: the sentence's edit [tp, fp, fn]. None for f0.5 with
        several references per sentence, whose corpus count picks each sentence's reference by the running F."""
        from .. import gen_metrics as G
        from ..stats import example_stats

        # as score(): every metric compares lower-cased text
        hyps = [h.lower() for h in preds]
        refs = [r["target"].lower() if isinstance(r["target"], str) else [x.lower() for x in r["target"]] for r in recs]
        srcs = [r["source"].lower() for r in recs]
        metric, lang = td.cfg.metric, td.cfg.lang
        if metric == "rouge_l":
            return example_stats(metric, "ratio", [[G.rouge_l([h], [r], lang=lang), 1.0] for h, r in zip(hyps, refs)])
        if metric.startswith("bleu_"):
            return example_stats(metric, "bleu", G.bleu_sentence_stats(hyps, refs, int(metric[5:]), lang=lang))
        if metric == "f0.5" and all(isinstance(r, str) for r in refs):
            counts = [G.correction_prf([s], [h], [r]) for s, h, r in zip(srcs, hyps, refs)]
            return example_stats(metric, "edit_f0.5", [[c["tp"], c["fp"], c["fn"]] for c in counts])
        return None

    def trivial(self, td: TaskView, recs: list[dict[str, Any]]) -> list[Any]:
        """Copy the source: F0.5 = 0 (no edit), a real floor for overlap metrics."""
        return [r["source"] for r in recs]

    def sample(self, rec: dict[str, Any], pred: Any) -> dict[str, Any]:
        return {"source": rec["source"], "reference": rec["target"], "output": pred}


def unk_texts(td: TaskView, text: str, n_prefix: int, keep: int) -> dict[int, str]:
    """{position in the model's input: source text} of each [UNK] among the source's pieces of `text` (a prefix
    of `n_prefix` pieces, then the source) that the input keeps (`keep` pieces after [CLS]): what an output
    [UNK] aligned to that position is read as (``copied_text``)."""
    (ids, offsets), = pieces(td.tok, [text])
    return {1 + k: text[a:b] for k, (i, (a, b)) in enumerate(zip(ids[:keep], offsets[:keep]))
            if i == td.tok.unk_id and k >= n_prefix}


def copied_text(td: TaskView, source: list[int], output: list[int], unk_text: dict[int, str]) -> str:
    """`output` as text, each [UNK] read as the text of the source [UNK] it is aligned to (`unk_text`, by
    position in `source`; the alignment is difflib's longest common blocks of the two id sequences: a corrector
    copies the source around its edits). An [UNK] aligned to none names no character and is dropped."""
    import difflib

    unk = td.tok.unk_id
    read: dict[int, str] = {}
    for a, b, n in difflib.SequenceMatcher(None, source, output, autojunk=False).get_matching_blocks():
        read.update({b + d: unk_text[a + d] for d in range(n) if output[b + d] == unk and a + d in unk_text})
    parts, start = [], 0
    for j, i in enumerate([*output, unk]):  # a final [UNK] closes the last run of known pieces
        if i != unk:
            continue
        parts.append(td.decode_text(output[start:j]))
        parts.append(read.get(j, "") if j < len(output) else "")
        start = j + 1
    out = ""
    for piece in parts:  # as decode_text: two Latin words or numbers in a row keep a space between them
        if out[-1:].isascii() and out[-1:].isalnum() and piece[:1].isascii() and piece[:1].isalnum():
            out += " "
        out += piece
    return out
