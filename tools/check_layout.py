#!/usr/bin/env python3
"""The repository's shape rules, checked by `make test` (ctest `layout`):
  1. no source file over 800 lines;
  2. no C++ function over 150 lines;
  3. a layer includes only itself and the layers it links (src/CMakeLists.txt's DEPS, transitively),
     so spmd/ never reaches into an op family's kernels;
  4. an op family's files include no other family's files (shared code lives in tensor/ or spmd/);
  5. no folder holds more than MAX_FOLDER_FILES source files or MAX_FOLDER_LINES lines of them
     directly: a room that grows past that is split into rooms (sub-folders or layers) before it
     becomes a grab-bag (src/shardwise/train/ held 50 files and 8,032 lines before it was split).
Usage: check_layout.py REPO_ROOT. Prints every violation; exit 1 if there is any."""
import os
import re
import sys

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 150
MAX_FOLDER_FILES = 40
MAX_FOLDER_LINES = 6000
SOURCE_EXT = ('.cc', '.h', '.cpp', '.py', '.cmake', '.sh')


def tracked_sources(root):
    for top in ('src', 'tests', 'bench', 'tools', 'fuzz', 'examples', 'python'):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith(SOURCE_EXT) or f == 'CMakeLists.txt':
                    yield os.path.join(dirpath, f)


def strip_cpp(text):
    """Comments, strings and character literals blanked, line breaks kept."""
    text = re.sub(r'//[^\n]*', '', text)
    text = re.sub(r'/\*.*?\*/', lambda m: '\n' * m.group(0).count('\n'), text, flags=re.S)
    text = re.sub(r'R"([^(]*)\((.*?)\)\1"', lambda m: '""' + '\n' * m.group(0).count('\n'), text, flags=re.S)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"'(\\.|[^'\\\n])*'", "''", text)


def long_functions(path):
    """(line, length, head) of every function body longer than the limit. A body is a brace block
    whose head ends like a function signature and that sits directly in namespace/class scope
    (lambdas and blocks inside a function count toward the function)."""
    text = strip_cpp(open(path, encoding='utf-8').read())
    stack, line, out = [], 1, []
    for i, c in enumerate(text):
        if c == '\n':
            line += 1
        elif c == '{':
            start = max(text.rfind(';', 0, i), text.rfind('}', 0, i), text.rfind('{', 0, i))
            head = ' '.join(text[start + 1:i].split())
            scope = re.search(r'\b(namespace|class|struct|enum|union)\b', head) and not head.endswith(')')
            func = re.search(r'\)\s*(const|noexcept|override|final|mutable|->\s*[\w:<>,\s*&]+)*\s*$', head)
            stack.append(('scope' if scope else 'func' if func else 'block', line, head))
        elif c == '}' and stack:
            kind, start_line, head = stack.pop()
            if kind == 'func' and all(k == 'scope' for k, _, _ in stack):
                length = line - start_line + 1
                if length > MAX_FUNCTION_LINES:
                    out.append((start_line, length, head[-70:]))
    return out


def layer_deps(root):
    """{layer: set of layers it may include} from the shardwise_layer(...) calls."""
    text = open(os.path.join(root, 'src', 'CMakeLists.txt'), encoding='utf-8').read()
    direct = {}
    for m in re.finditer(r'shardwise_layer\((\w+)([^)]*)\)', text):
        direct[m.group(1)] = set(re.findall(r'shardwise_(\w+)', m.group(2)))
    # Links a layer gets where an option builds them (cli links cuda_ops where CUDA is built).
    for m in re.finditer(r'target_link_libraries\(shardwise_(\w+)([^)]*)\)', text):
        direct.setdefault(m.group(1), set()).update(re.findall(r'shardwise_(\w+)', m.group(2)))
    closed = {}

    def close(layer):
        if layer not in closed:
            closed[layer] = {layer}
            for d in direct.get(layer, ()):
                closed[layer] |= close(d)
        return closed[layer]

    for layer in direct:
        close(layer)
    return closed


def crowded_folders(root):
    """(folder, files, lines) of every folder whose own source files (not its sub-folders') pass
    either limit."""
    per_folder = {}
    for path in tracked_sources(root):
        if not path.endswith(('.cc', '.h', '.cpp', '.py')):
            continue
        with open(path, encoding='utf-8', errors='replace') as f:
            lines = f.read().count('\n')
        files, total = per_folder.get(os.path.dirname(path), (0, 0))
        per_folder[os.path.dirname(path)] = (files + 1, total + lines)
    return [(os.path.relpath(d, root), n, lines) for d, (n, lines) in sorted(per_folder.items())
            if n > MAX_FOLDER_FILES or lines > MAX_FOLDER_LINES]


def main(root):
    problems = []
    for folder, files, lines in crowded_folders(root):
        problems.append(f'{folder}/: {files} source files, {lines} lines directly in it (at most '
                        f'{MAX_FOLDER_FILES} files and {MAX_FOLDER_LINES} lines: split it into rooms)')
    allowed = layer_deps(root)
    include = re.compile(r'#include "shardwise/(\w+)/(?:(\w+)/)?')
    for path in sorted(tracked_sources(root)):
        rel = os.path.relpath(path, root)
        with open(path, encoding='utf-8', errors='replace') as f:
            lines = f.read().split('\n')
        n = len(lines) - (1 if lines and lines[-1] == '' else 0)
        if n > MAX_FILE_LINES:
            problems.append(f'{rel}: {n} lines (at most {MAX_FILE_LINES})')
        if not path.endswith(('.cc', '.h', '.cpp')):
            continue
        for start, length, head in long_functions(path):
            problems.append(f'{rel}:{start}: function of {length} lines (at most {MAX_FUNCTION_LINES}): {head}')
        parts = rel.split(os.sep)
        if parts[:2] != ['src', 'shardwise']:
            continue
        layer = parts[2]
        family = parts[3] if layer == 'ops' and len(parts) > 4 else None
        for number, text in enumerate(lines, 1):
            m = include.match(text)
            if not m:
                continue
            target, sub = m.group(1), m.group(2)
            if layer in allowed and target not in allowed[layer]:
                problems.append(f'{rel}:{number}: layer {layer} includes {target}/, which it does not link')
            if family and target == 'ops' and sub and sub != family:
                problems.append(f'{rel}:{number}: op family {family} includes family {sub}')
    for p in problems:
        print(p)
    print(f'{len(problems)} layout problems')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else '.'))
