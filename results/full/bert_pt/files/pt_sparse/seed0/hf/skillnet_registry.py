"""The built-in routers (routers.py, learned_map.py) and task extras (pals.py) in one place: importing this
module registers every one of them, so a model built from a config finds the names its config stores."""

from .skillnet_extras import EXTRAS, build_extras, register_extras
from .skillnet_learned_map import LearnedMapRouter, LearnedMapSettings  # noqa: F401  (importing registers the router)
from .skillnet_pals import ProjectedAttentionLayers, ProjectedAttentionSettings  # noqa: F401  (importing registers it)
from .skillnet_routers import ROUTERS, Router, TokenGateSettings, build_router, register_router, router_class

__all__ = ["EXTRAS", "ROUTERS", "LearnedMapSettings", "ProjectedAttentionSettings", "Router", "TokenGateSettings", "build_extras", "build_router", "register_extras", "register_router",
           "router_class"]
