"""The package is installed (not imported from the source tree), is this build's, ships its type
stubs, and says what the C++ comments say."""
import hashlib
import inspect
import os
import pathlib

import shardwise as sw
from shardwise import _core


def digest(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def test_the_installed_native_module_is_this_builds():
    installed = pathlib.Path(_core.__file__)
    assert "site-packages" in installed.parts, installed
    built = os.environ.get("SHARDWISE_BUILT_MODULE")
    assert built, "make test sets SHARDWISE_BUILT_MODULE"
    assert digest(installed) == digest(built), "the venv holds another build's module: run make test"


def test_type_stubs_and_marker_ship_with_the_package():
    root = pathlib.Path(sw.__file__).parent
    stub = (root / "_core.pyi").read_text()
    assert (root / "py.typed").exists()
    for name in ("def infer(", "def plan_reshard(", "class Mesh", "def local_shape("):
        assert name in stub, name


def test_every_public_name_has_a_docstring():
    public = [n for n in dir(sw) if not n.startswith("_")]
    missing = [n for n in public if not inspect.getdoc(getattr(sw, n)) and not isinstance(getattr(sw, n), str)]
    assert not missing, missing
    assert "cheapest plan" in sw.plan_reshard.__doc__
