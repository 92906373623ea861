#!/usr/bin/env python3
"""Runs every command of the fenced shell blocks of README.md and docs/*.md (the doc test).

Usage: test_doc_commands.py SHARDWISE_BIN REPO_ROOT [FILE.md ...]

Blocks: ```sh, ```bash, ```shell (every line is a command; `\\` continues a line, `#` starts a
comment) and ```console (only the lines after `$ ` are commands, the rest is output). Other blocks
(```text, ```python, ```cpp, ...) are not run.

Each file's blocks run in order in one scratch directory of their own (a later command may use what
an earlier one wrote, e.g. the demo's checkpoint), where `build/bin/shardwise` is a wrapper around
SHARDWISE_BIN, and `examples/`, `tests/` and `tools/` are links to the repository's. A command
fails the test when it exits non-zero; the failure names the file, the line and the command.

Small sizes, stated where the reader sees them: an HTML comment right before a block,
  <!-- doctest: train-args --steps 20 --save-every 20 -->
gives every `shardwise train` of the block those options (in place of the same options the command
gives: an option may be given once),
  <!-- doctest: replace checkpoint-4500=checkpoint-20 -->
rewrites text in the block's commands before they run, and
  <!-- doctest: skip REASON -->
does not run the block: the test prints it as skipped with its reason. Several comments may stand
before one block, one per line.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHELL_INFOS = {"sh", "bash", "shell", "console"}
TIMEOUT_S = 300


def strip_comment(line):
    """The line without a trailing `# comment` outside quotes."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def parse_blocks(path):
    """[(info, directives, [(line_no, command)])] of the file's shell blocks."""
    lines = Path(path).read_text().splitlines()
    blocks, directives, i = [], [], 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\s*<!--\s*doctest:\s*(\w[\w-]*)\s*(.*?)\s*-->\s*$", line)
        if m:
            directives.append((m.group(1), m.group(2)))
            i += 1
            continue
        fence = re.match(r"^(\s*)```(\w*)", line)
        if not fence:
            if line.strip():
                directives = []
            i += 1
            continue
        indent, info = len(fence.group(1)), fence.group(2)
        body, start = [], i + 1
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append((i + 1, lines[i][indent:]))
            i += 1
        i += 1
        if info in SHELL_INFOS:
            blocks.append((info, start, directives, commands_of(info, body)))
        directives = []
    return blocks


def commands_of(info, body):
    commands, pending, pending_line = [], "", 0
    for line_no, text in body:
        if info == "console" and not pending:
            if not text.startswith("$ "):
                continue
            text = text[2:]
        if not pending:
            pending_line = line_no
        if text.rstrip().endswith("\\"):
            pending += text.rstrip()[:-1] + " "
            continue
        command = strip_comment(pending + text).strip()
        pending = ""
        if command:
            commands.append((pending_line, command))
    return commands


# `build/bin/shardwise` in the scratch directory: `train` gets the block's small sizes
# ($DOCTEST_TRAIN_ARGS) in place of the same options the command gives (an option may be given once).
WRAPPER = """#!/usr/bin/env python3
import os, shlex, sys
real, args = REAL, sys.argv[1:]
extra = shlex.split(os.environ.get("DOCTEST_TRAIN_ARGS", ""))
if args[:1] == ["train"] and extra:
    names = {a for a in extra if a.startswith("--")}
    kept, i = [], 0
    while i < len(args):
        a = args[i]
        if a.split("=", 1)[0] in names:
            takes_value = "=" not in a and i + 1 < len(args) and not args[i + 1].startswith("--")
            i += 2 if takes_value else 1
            continue
        kept.append(a)
        i += 1
    args = kept + extra
os.execv(real, [real] + args)
"""


def make_scratch(shardwise, root):
    scratch = Path(tempfile.mkdtemp(prefix="shardwise-doctest-"))
    (scratch / "build" / "bin").mkdir(parents=True)
    wrapper = scratch / "build" / "bin" / "shardwise"
    wrapper.write_text(WRAPPER.replace("REAL", repr(str(Path(shardwise).resolve()))))
    wrapper.chmod(0o755)
    for name in ("examples", "tests", "tools"):
        (scratch / name).symlink_to(Path(root).resolve() / name)
    return scratch


def run_file(path, shardwise, root, env):
    """(ran, skipped, failures) of one Markdown file."""
    ran, skipped, failures = 0, 0, []
    blocks = parse_blocks(path)
    if not blocks:
        return ran, skipped, failures
    scratch = make_scratch(shardwise, root)
    env = dict(env, XDG_CACHE_HOME=str(scratch / ".cache"))  # gemm-check caches here, not in ~/.cache
    rel = os.path.relpath(path, root)
    for info, start, directives, commands in blocks:
        kinds = dict(directives)
        if "skip" in kinds:
            skipped += len(commands)
            print(f"SKIP {rel}:{start} ({len(commands)} command(s)): {kinds['skip']}")
            continue
        block_env = dict(env, DOCTEST_TRAIN_ARGS=kinds.get("train-args", ""))
        replaces = [r.split("=", 1) for k, r in directives if k == "replace"]
        for line_no, command in commands:
            for old, new in replaces:
                command = command.replace(old, new)
            t0 = time.monotonic()
            try:
                p = subprocess.run(["bash", "-c", command], cwd=scratch, env=block_env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, timeout=TIMEOUT_S, text=True)
                rc, out = p.returncode, p.stdout
            except subprocess.TimeoutExpired as e:
                rc, out = "timeout", (e.stdout or b"").decode(errors="replace")
            ran += 1
            print(f"{'ok  ' if rc == 0 else 'FAIL'} {rel}:{line_no} ({time.monotonic() - t0:.1f} s): {command}")
            if rc != 0:
                tail = "\n".join(out.splitlines()[-8:])
                failures.append(f"{rel}:{line_no}: exit {rc}: {command}\n{tail}")
    if failures:
        print(f"(the scratch directory of {rel} is kept: {scratch})")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    return ran, skipped, failures


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    shardwise, root = argv[1], argv[2]
    files = argv[3:] or [os.path.join(root, "README.md")] + sorted(
        str(p) for p in Path(root, "docs").glob("*.md"))
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               SHARDWISE_DOC_TEST="1")
    env.pop("DOCTEST_TRAIN_ARGS", None)
    t0 = time.monotonic()
    ran = skipped = 0
    failures = []
    for f in files:
        r, s, fl = run_file(f, shardwise, root, env)
        ran, skipped, failures = ran + r, skipped + s, failures + fl
    print(f"doc test: {ran} command(s) run, {skipped} skipped (listed above), "
          f"{len(failures)} failed, {time.monotonic() - t0:.0f} s")
    for f in failures:
        print(f"doc command failed: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
