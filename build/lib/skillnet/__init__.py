"""SkillNet's import path: ``skillnet.model``, ``skillnet.data_prep``, ``skillnet.pretrain``,
``skillnet.finetune`` and ``skillnet.training``.

The repository keeps these as top-level folders (the layout the project promises); the installed name is
``skillnet.<folder>`` so that a user's own ``model.py`` or ``training/`` can never shadow the library.
In a source checkout (plain clone or ``pip install -e .``) the folders are found next to this package;
a built wheel places them inside it.
"""

from __future__ import annotations

import os as _os

_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_ROOT, "model", "__init__.py")) and _ROOT not in __path__:
    __path__.append(_ROOT)

__version__ = "0.1.0"
