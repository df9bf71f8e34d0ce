"""Writes example.csv: vTrain-style layouts (2-8 A100s, GPT 0.15-0.8B) timed by the step model on a cluster
whose matrix multiplies run at 80 % of the table, whose host takes 50 us a kernel and 10 ms a step, with
±3 % noise, in vTrain's header. The examples of docs/audit.md run on it, so that a fit can be checked
against what is true; it is not a measurement.

    python tests/data/runs/generate.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from costmodel.audit.synthetic import synthetic  # noqa: E402

TRUTH = {"gemm_scale": 0.8, "launch_s": 5e-5, "step_s": 0.01}

if __name__ == "__main__":
    made = synthetic(Path(tempfile.mkdtemp()), TRUTH, noise=0.03)
    shutil.copy(made, HERE / "example.csv")
    print(f"wrote {HERE / 'example.csv'}")
