"""Bootstrap for ``eagle3-patches run``: put on PYTHONPATH, imported by every Python process.

sglang starts its scheduler, detokenizer and TP workers with multiprocessing ``spawn``;
each child inherits PYTHONPATH and the EAGLE3_PATCHES_* variables, so each one runs
this file at start-up and applies the same patches (post-import hooks: nothing of
sglang is imported here).  Any other ``sitecustomize`` on the path still runs after
this one (the ``opentelemetry-instrument`` / ``ddtrace-run`` pattern).
"""

import importlib.machinery
import importlib.util
import os
import sys


def _activate():
    from eagle3_patches import _bootstrap

    _bootstrap.activate_from_env()


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _activate()
except Exception as exc:  # never break the user's interpreter start-up; say why instead
    sys.stderr.write(f"eagle3-patches: bootstrap failed, patches NOT applied: {type(exc).__name__}: {exc}\n")
    try:
        from eagle3_patches import settings as _settings

        _raise = _settings.current().on_error == "raise"
    except Exception:
        _raise = os.environ.get("EAGLE3_PATCHES_ON_ERROR", "").strip().lower() == "raise"  # the library itself cannot be imported
    if _raise:
        raise
_chain()
