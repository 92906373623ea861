#!/usr/bin/env python3
"""Step time of GPT-2 written in Python (shardwise.models.GPT2) against the built-in GPT-2: the same
run (mesh, size, batch), ABAB-interleaved rounds, the median step of each. The graph is traced once
when the Trainer starts; Python is not on the step path, so the two should agree within noise.

Usage: python bench/python_model_step.py [MESH] [ROUNDS]   (with the package installed, e.g.
build/py-venv/bin/python; default dp=2,tp=2 and 3 rounds)
"""
import statistics
import sys
import tempfile
import time

import shardwise as sw
from shardwise.models import GPT2

SIZE = {"layers": 4, "hidden": 256, "heads": 4}
RUN = {"seq": 128, "vocab": 256, "global_batch": 8, "digits": 3, "progress": "none"}
STEPS = 12  # of which the first 2 are warm-up and the last is left out


def step_times(mesh, python, run_dir):
    model = GPT2(seq=RUN["seq"], vocab=RUN["vocab"], **SIZE) if python else None
    options = dict(RUN, mesh=mesh, steps=STEPS, run_dir=run_dir)
    if not python:
        options.update(SIZE)
    start = time.perf_counter()
    with sw.Trainer(model=model, **options) as trainer:
        setup = time.perf_counter() - start
        times = []
        for _ in range(STEPS):
            t0 = time.perf_counter()
            trainer.step()
            times.append(time.perf_counter() - t0)
    return setup, times[2:-1]  # the built-in run evaluates after its last step


def main():
    mesh = sys.argv[1] if len(sys.argv) > 1 else "dp=2,tp=2"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    steps = {False: [], True: []}
    setups = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for python in (False, True):
                setup, times = step_times(mesh, python, f"{tmp}/{r}-{python}")
                setups[python].append(setup)
                steps[python] += times
    for python in (False, True):
        name = "python GPT2" if python else "built-in"
        print(f"{name:12} median step {statistics.median(steps[python]) * 1e3:8.2f} ms   "
              f"start {statistics.median(setups[python]):.2f} s   ({len(steps[python])} steps)")
    ratio = statistics.median(steps[True]) / statistics.median(steps[False])
    print(f"python / built-in step time: {ratio:.3f}")


if __name__ == "__main__":
    main()
