"""The reproduction report: kept for old imports; the code is `skillnet.experiments.report`."""

from skillnet.experiments.report import build

__all__ = ["build"]
