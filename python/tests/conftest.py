"""The package under test is the installed one (make test installs it into build/py-venv).
SHARDWISE_BIN names the `shardwise` binary of the same build, for comparisons with the CLI."""
import os
import subprocess

import pytest


@pytest.fixture(scope="session")
def shardwise_bin():
    path = os.environ.get("SHARDWISE_BIN")
    if not path or not os.path.exists(path):
        pytest.fail("SHARDWISE_BIN must name the shardwise binary (make test sets it)")
    return path


@pytest.fixture(scope="session")
def cli(shardwise_bin):
    def run(*args):
        p = subprocess.run([shardwise_bin, *args], capture_output=True, text=True)
        assert p.returncode == 0, f"shardwise {' '.join(args)}: {p.stderr}"
        return p.stdout
    return run
