"""Every ```python block of docs/python.md runs (each file's blocks in order, in one namespace)."""
import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks(name):
    path = DOCS / name if (DOCS / name).exists() else DOCS.parent / name
    found = BLOCK.findall(path.read_text())
    # README.md's transformers example needs transformers (make hf-parity runs it): only the
    # blocks that use shardwise alone run here.
    return [b for b in found if "transformers" not in b]


@pytest.mark.parametrize("name", ["python.md", "README.md"])
def test_every_python_block_of_the_guide_runs(name, tmp_path, monkeypatch):
    found = blocks(name)
    assert found, f"docs/{name} has no python block"
    monkeypatch.chdir(tmp_path)
    namespace = {}
    for i, code in enumerate(found):
        exec(compile(code, f"docs/{name} python block {i + 1}", "exec"), namespace)
