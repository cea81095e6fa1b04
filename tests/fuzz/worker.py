"""The reader process the fuzz runner starts: `python -m tests.fuzz.worker CORPUS MEMORY`."""
from __future__ import annotations

import sys
from pathlib import Path

from tests.fuzz.runner import serve

if __name__ == "__main__":
    serve(Path(sys.argv[1]), int(sys.argv[2]))
