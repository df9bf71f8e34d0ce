"""How long `cp-plan ... --format json` takes, beside the cost of starting Python and importing sympy.

    python benchmarks/cli_latency.py [--repeats 21] [--smoke]

The commands run interleaved, round after round, so machine noise hits them alike; the script prints
each median and its ratio to `python -c pass`. Goals: the report path imports neither sympy, torch, numpy,
PyYAML nor rich, and takes at most half the wall time of llm-analysis answering a training question, run
beside it when a Python with llm-analysis is named by LLM_ANALYSIS_PYTHON (e.g. a venv with
`pip install llm-analysis`).
Beside them, the import of the libraries the plan command loads (typer, and pydantic, which typer's option
parsing is built on; numpy, PyYAML and rich it does not load) and nothing else: the floor under the plan
command, which no change to cp-plan's own code lowers. Last, a notebook's first look at the symbolic model:
importing the formulas, and every formula's expression in base symbols (read from the generated cache, with
no Max or Min evaluated again: 36-45 s on two cores when they were), each as a ratio to importing sympy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPORT = ["--seq", "262144", "--n", "8", "--hw", "a100-nvlink", "--format", "json"]
CORE = "  core libraries only"
FORMULAS = "import the formulas"
EXPRESSIONS = "  and every expression"


def commands() -> dict[str, list[str]]:
    script = shutil.which("cp-plan")
    report = [script, *REPORT] if script else [sys.executable, "-m", "costmodel", *REPORT]
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        'python -c "import sympy"': [sys.executable, "-c", "import sympy"],
        "cp-plan ... --format json": report,
        "  its imports only": [
            sys.executable,
            "-c",
            "import costmodel.cli.app, costmodel.plans.evaluate, costmodel.cli.render",
        ],
        # the libraries the plan command loads, imported and nothing else: its floor (typer's option parsing
        # builds pydantic TypeAdapters, so the command would load pydantic even without its own models)
        CORE: [sys.executable, "-c", "import typer; from pydantic import BaseModel, Field, TypeAdapter"],
        # a notebook's first look at the symbolic model: the import, then every formula in base symbols
        # (read from the generated cache; what `cp-plan formulas --latex` builds before it prints)
        FORMULAS: [sys.executable, "-c", "from costmodel.symbolic import formulas"],
        EXPRESSIONS: [
            sys.executable,
            "-c",
            "from costmodel.symbolic import formulas\nfor f in formulas.FORMULAS.values(): f.expr",
        ],
    } | _llm_analysis()


def _llm_analysis() -> dict[str, list[str]]:
    """llm-analysis answering a training question, when LLM_ANALYSIS_PYTHON names a Python that has it."""
    python = os.environ.get("LLM_ANALYSIS_PYTHON")
    if not python:
        return {}
    question = ["--model_name", "NousResearch_Llama-2-7b-hf", "--gpu_name", "a100-sxm-80gb", "--seq_len", "4096",
                "--total_num_tokens", "1280000", "--output_dir", tempfile.mkdtemp()]  # fmt: skip
    return {"llm-analysis train (7B, A100)": [python, "-m", "llm_analysis.analysis", "train", *question]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--smoke", action="store_true", help="two rounds: the suite runs it")
    args = parser.parse_args()
    if args.smoke:
        args.repeats = 2  # the fewest the quartiles take
    cmds = commands()
    # As an installed package runs: its bytecode compiled (the first, untimed round writes it).
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "check": True, "env": env}
    for cmd in cmds.values():
        subprocess.run(cmd, **quiet)
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(args.repeats):
        for name, cmd in cmds.items():
            start = time.perf_counter()
            subprocess.run(cmd, **quiet)
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["python -c pass"])
    print(f"{'command':32} {'median':>9} {'IQR':>9} {'x python':>9}   ({args.repeats} interleaved runs)")
    for name, values in times.items():
        q1, _, q3 = statistics.quantiles(values, n=4)
        med = statistics.median(values)
        print(f"{name:32} {med * 1e3:7.0f}ms {(q3 - q1) * 1e3:7.0f}ms {med / base:8.1f}x")
    report = statistics.median(times["cp-plan ... --format json"])
    sympy_ = statistics.median(times['python -c "import sympy"'])
    print(f"\ncp-plan json / import sympy = {report / sympy_:.2f}")
    for name in (FORMULAS, EXPRESSIONS):
        print(f"{name.strip()} / import sympy = {statistics.median(times[name]) / sympy_:.2f}")
    other = next((name for name in times if name.startswith("llm-analysis")), None)
    if other:
        ratio = report / statistics.median(times[other])
        print(
            f"cp-plan json / llm-analysis = {ratio:.2f}; goal <= 0.5: {'met' if ratio <= 0.5 else 'missed'}"
        )
        floor = statistics.median(times[CORE]) / statistics.median(times[other])
        print(f"core libraries' imports alone / llm-analysis = {floor:.2f} (the floor of that ratio)")


if __name__ == "__main__":
    main()
