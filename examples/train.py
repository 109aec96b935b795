"""The example workload run from a source checkout: `python examples/train.py [options]`.

The code is the package examples/trainer (spotorch_example.train), which pipelines ship to Vertex
AI as a Python package on a prebuilt container; this file runs the same code as a command, for
pipelines with a custom image and for trying it by hand (docs/trainer-guide.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "trainer"))

from spotorch_example.train import *  # noqa: F403  (tests import this file as `train`)
from spotorch_example.train import main

if __name__ == "__main__":
    sys.exit(main())
