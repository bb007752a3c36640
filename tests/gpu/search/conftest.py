"""The string-search tests import `search_cases`, the module beside them (the fresh `rng`
fixture is tests/conftest.py's)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import search_cases`
