"""Everything that turns a run into something served: HF folders, the model card, plain exports, ONNX and int8.

* `hf_folder`: a pre-training checkpoint (plain or ZeRO) as an HF folder, or a SkillNet export copied with
  another default task; `finish_folder` / `source_id` put any export folder in place and name its source.
* `card`: the last step of every export (default task, labels, prompts) and its model card.
* `flatten`: one task of a SkillNet model as a stock transformers model (skills merged into one FFN).
* `plain`: ``export --plain``, that stock model written and measured against the sparse one.
* `onnx_graphs` / `onnx_seq2seq`: its ONNX graphs (fp32, int8) and the numpy decoder shipped beside them.
* `cli`: the export command's flags (``python -m skillnet.pretrain.export`` runs it).

Layering: export/ imports common/, model/, data_prep/ and training/, nothing above them (not finetune/,
not pretrain/): what a plain export needs of a fine-tuned task is passed in (`plain.TaskLoader`). model/ does
not import export/: what ``save_pretrained`` itself writes (the remote modeling code, the task classes it
serves, the tokenizer) stays in model/hub.py and model/hf_tasks.py, since that code is copied into every
saved folder. Nothing is imported here, so ``import skillnet.export.cli`` stays light.
"""
