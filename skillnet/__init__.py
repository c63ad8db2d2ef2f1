"""SkillNet's import path: ``skillnet.model``, ``skillnet.data_prep``, ``skillnet.pretrain``,
``skillnet.finetune``, ``skillnet.training``, ``skillnet.export``, ``skillnet.common`` and
``skillnet.experiments``.

The repository keeps these as top-level folders (the layout the project promises); the installed name is
``skillnet.<folder>`` so that a user's own ``model.py`` or ``training/`` can never shadow the library.
The mapping lives in one place, ``[tool.setuptools.package-dir]`` in pyproject.toml: a wheel copies each
folder into this package, an editable install (``pip install -e .``) maps each name to its folder. Nothing
here extends ``__path__``, so a checkout resolves exactly the modules a wheel holds: ``bench``, ``tests``
and ``scripts`` are not ``skillnet.*``, and no file can load under two names.
"""

from __future__ import annotations

__version__ = "0.1.0"
