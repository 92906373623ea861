#!/usr/bin/env python3
"""The doc test fails on what it says it catches: a Markdown file with a mistyped option in a
shell block fails with its file, line and command; a `skip` block is printed with its reason; the
small sizes of a `train-args` comment replace the command's own.
Usage: test_doc_harness.py SHARDWISE_BIN REPO_ROOT"""
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(shardwise, root, text):
    with tempfile.TemporaryDirectory() as d:
        md = Path(d) / "planted.md"
        md.write_text(text)
        p = subprocess.run([sys.executable, str(HERE / "test_doc_commands.py"), shardwise, root, str(md)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return p.returncode, p.stdout


def main(shardwise, root):
    failed = []
    rc, out = run(shardwise, root, "# t\n\n```sh\nbuild/bin/shardwise rules\nbuild/bin/shardwise train --stpes 3\n```\n")
    if rc != 1 or "planted.md:5: exit 2: build/bin/shardwise train --stpes 3" not in out or "did you mean" not in out:
        failed.append(f"a mistyped option was not reported with its line (exit {rc}):\n{out}")
    rc, out = run(shardwise, root, "<!-- doctest: skip needs a cluster -->\n```sh\nbuild/bin/shardwise trian\n```\n")
    if rc != 0 or "SKIP" not in out or "needs a cluster" not in out:
        failed.append(f"a skipped block was not listed with its reason (exit {rc}):\n{out}")
    rc, out = run(shardwise, root, "<!-- doctest: train-args --steps 2 --progress none -->\n```console\n"
                  "$ build/bin/shardwise train --steps 100000 --run-dir r\noutput, not run\n"
                  "$ test \"$(grep -c '\"step\"' r/metrics.jsonl)\" = 2\n```\n")
    if rc != 0 or "2 command(s) run" not in out:
        failed.append(f"train-args did not replace --steps, or console output ran (exit {rc}):\n{out}")
    for f in failed:
        print(f, file=sys.stderr)
    print("doc harness:", "ok" if not failed else f"{len(failed)} failure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
