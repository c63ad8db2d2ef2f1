"""Raw corpus -> memory-mapped pre-training shards (`python -m skillnet.data_prep --help`, docs/data_prep.md).

Modules: `tokenizer` (WordPiece + fingerprint), `corpus` (inputs, work units, bad-input report),
`shards` (format, manifest, verify, merge), `build` (the parallel, restartable build). `tasks/` holds
the fine-tuning task schema and converters.
"""
