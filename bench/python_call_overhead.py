#!/usr/bin/env python3
"""The Python call overhead of shardwise.infer and local_shape: the time of a call from Python
minus the time of the same rule question asked in C++ (shardwise._core._seconds_per_ask_rule).

Usage: python bench/python_call_overhead.py   (with the package installed, e.g. build/py-venv/bin/python)
"""
import statistics
import timeit

import shardwise as sw
from shardwise import _core

N = 20000


def per_call(fn):
    return min(timeit.repeat(fn, number=N, repeat=5)) / N


def main():
    mesh = sw.Mesh({"dp": 2, "tp": 2})
    cases = [
        ("matmul", [(8, 16), (16, 4)], [sw.Placements("S(0),S(1)"), sw.Placements("R,R")]),
        ("relu", [(8, 16)], [sw.Placements("S(0),S(1)")]),
        ("softmax", [(8, 16)], [sw.Placements("S(0),R")]),
    ]
    print(f"{'op':10} {'python us':>10} {'c++ us':>8} {'overhead us':>12}")
    overheads = []
    for op, shapes, placements in cases:
        py = per_call(lambda: sw.infer(op, mesh, shapes, placements))
        cpp = min(_core._seconds_per_ask_rule(op, mesh, shapes, placements, N) for _ in range(5))
        overheads.append(py - cpp)
        print(f"{op:10} {py * 1e6:10.2f} {cpp * 1e6:8.2f} {(py - cpp) * 1e6:12.2f}")
    ls = per_call(lambda: sw.local_shape((8, 16), mesh, cases[0][2][0], 3))
    print(f"local_shape from Python: {ls * 1e6:.2f} us a call")
    print(f"median infer overhead: {statistics.median(overheads) * 1e6:.2f} us")


if __name__ == "__main__":
    main()
