"""The package deserializes no pickle but through its own reader (docs/security.md, "What a torch file can and cannot
do to you"): no ``torch.load``, ``pickle`` / ``marshal`` / ``shelve`` / ``dill`` / ``joblib`` load, ``numpy.load``
(``allow_pickle``) or ``zipfile`` reading anywhere in ``eagle3_patches``; strangers' torch files go through
``acceptance/torch_file.py``, which parses the zip and the pickle itself.  (``testing/isolation.py`` starts test
processes with ``multiprocessing``, which pickles this package's own objects between them, never a file.)"""

from __future__ import annotations

import ast
from pathlib import Path

import eagle3_patches

ROOT = Path(eagle3_patches.__file__).parent
#: modules whose import alone is a deserializer of arbitrary objects (or an archive reader that is not ours)
MODULES = {"pickle", "_pickle", "cPickle", "marshal", "shelve", "dill", "joblib", "cloudpickle", "zipfile"}
#: ``<name>.<attribute>`` calls that unpickle
CALLS = {("torch", "load"), ("np", "load"), ("numpy", "load"), ("serialization", "load"), ("pd", "read_pickle")}


def unpicklers(source: str) -> list[str]:
    """Each import of :data:`MODULES` and each call of :data:`CALLS` in ``source``, as ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] in MODULES]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in MODULES:
            found.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch" and any(a.name == "load" for a in node.names):
            found.append(f"{node.lineno}: from torch import load")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if (name, node.func.attr) in CALLS:
                found.append(f"{node.lineno}: {name}.{node.func.attr}(...)")
    return found


def test_the_package_unpickles_nothing_but_through_its_own_reader():
    found = {
        str(path.relative_to(ROOT)): hits
        for path in sorted(ROOT.rglob("*.py"))
        if (hits := unpicklers(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_the_scan_sees_each_way_to_unpickle():
    for source in (
        "import torch\ntorch.load('x', weights_only=True)",
        "from torch import load",
        "import pickle",
        "from pickle import loads",
        "import zipfile",
        "import numpy as np\nnp.load('x', allow_pickle=True)",
        "import torch.serialization\ntorch.serialization.load('x')",
    ):
        assert unpicklers(source), source
    assert unpicklers("import json\njson.loads('1')\nimport gzip") == []
