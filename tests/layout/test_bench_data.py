#!/usr/bin/env python3
"""The benchmarks train on a fixed corpus: no script or program in bench/ reads README.md (which is
rewritten as the project changes: figures taken on its bytes could not be compared), and the
corpus they read, tests/data/fables.txt, holds the bytes it held when the benchmarks moved to it
(2026-11-28). Usage: test_bench_data.py REPO_ROOT (ctest `bench_data`)."""
import hashlib
import os
import re
import sys

FABLES_SHA256 = '7dbb021bdc5d99027d330521e7e54d715850f01873806ef89cbde52ee045733d'


def main(root):
    problems = []
    bench = os.path.join(root, 'bench')
    for name in sorted(os.listdir(bench)):
        path = os.path.join(bench, name)
        if not os.path.isfile(path):
            continue
        for number, line in enumerate(open(path, encoding='utf-8', errors='replace'), 1):
            if re.search(r'README\.md', line) and not re.search(r'README\.md changes', line):
                problems.append(f'bench/{name}:{number}: reads README.md; use tests/data/fables.txt: {line.strip()}')
    fables = os.path.join(root, 'tests', 'data', 'fables.txt')
    digest = hashlib.sha256(open(fables, 'rb').read()).hexdigest()
    if digest != FABLES_SHA256:
        problems.append(f'tests/data/fables.txt changed (sha256 {digest}): the benchmarks\' figures were taken on '
                        f'{FABLES_SHA256}; add a new file for new text')
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main(os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else '.')))
