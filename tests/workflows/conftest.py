"""Make the repository's ``workflows`` package importable (it is not installed with dvml).

Without this, ``import workflows`` would find this test directory (a namespace package named
``workflows`` on the path pytest adds); a regular package anywhere on ``sys.path`` wins.
"""

from __future__ import annotations

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
