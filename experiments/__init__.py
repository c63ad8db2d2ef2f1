"""The papers' experiments, reproduced stage by stage (``skillnet-reproduce``, ``python -m
skillnet.experiments``, ``python scripts/reproduce.py``): profiles (sizes and budgets), the stage runner,
the NLU and NLG stages, the FLOPs / GPU-hours estimate and the report. See ``__main__`` for the stages."""
