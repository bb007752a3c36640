"""Puts this directory on sys.path, for `import jpeg_variants` (shared test inputs)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
