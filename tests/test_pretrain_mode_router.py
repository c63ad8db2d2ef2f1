"""Pre-training's mode line asks the router how skills are picked; it compares no router name."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from skillnet.model.registry import ROUTERS, register_router
from skillnet.model.routers import TaskMapRouter
from skillnet.pretrain.archs import _routing


@pytest.fixture
def renamed_task_map() -> Iterator[str]:
    class RenamedTaskMap(TaskMapRouter):
        """The task map under another name: objectives still pick their skills."""

    register_router("renamed_task_map")(RenamedTaskMap)
    yield "renamed_task_map"
    del ROUTERS["renamed_task_map"]  # registered for this test only


def _args(tmp_path: Path, router: str | None) -> argparse.Namespace:
    config = None
    if router is not None:
        config = tmp_path / "model.json"
        config.write_text(json.dumps({"router": router}))
    return argparse.Namespace(arch="bert", preset="tiny", init_from_dense=None, model_config=config)


def test_a_router_that_uses_the_task_map_is_described_by_what_it_does(tmp_path: Path, renamed_task_map: str) -> None:
    assert _routing(_args(tmp_path, None)) == "skill FFNs, each objective activates its skills"
    assert _routing(_args(tmp_path, renamed_task_map)) == "skill FFNs, each objective activates its skills"
    assert "a token gate picks 2 of the 7" in _routing(_args(tmp_path, "topk"))
    from_dense = argparse.Namespace(arch="bert", preset=None, init_from_dense="hf/bert", model_config=None)
    assert _routing(from_dense) == "skill FFNs, each objective activates its skills"  # the config's default router


def test_an_unknown_router_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="router='nope'"):
        _routing(_args(tmp_path, "nope"))
