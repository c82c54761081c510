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


class _RefuseSglang:
    """A meta-path finder that refuses to import sglang: installed when the patches could not be loaded in a
    process started under ``eagle3-patches run``, so that no server runs unpatched by accident."""

    def __init__(self, reason):
        self.reason = reason

    def find_spec(self, name, path=None, target=None):
        if name == "sglang" or name.startswith("sglang."):
            raise ImportError(
                f"eagle3-patches: refusing to import sglang in pid {os.getpid()} ({sys.executable}): this process was "
                f"started under `eagle3-patches run` but the patches could not be loaded ({self.reason}). Install "
                "eagle3-patches in this Python, or run the command with the Python that has it; "
                "EAGLE3_PATCHES_ON_ERROR=warn runs sglang unpatched instead."
            )
        return None


try:
    _activate()
except Exception as exc:  # never break the interpreter's start-up itself; say why, and keep sglang out
    _reason = f"{type(exc).__name__}: {exc}"
    try:
        from eagle3_patches import settings as _settings

        _on_error, _explicit = _settings.current().on_error, _settings.current().on_error_explicit
    except Exception:  # noqa: BLE001 - the library itself cannot be imported (nor its settings): the one direct read
        _on_error = os.environ.get("EAGLE3_PATCHES_ON_ERROR", "").strip().lower()
        _explicit = bool(_on_error)
    _explicit_warn = _explicit and _on_error == "warn"
    _bar = "=" * 100
    sys.stderr.write(
        f"{_bar}\neagle3-patches: bootstrap FAILED in pid {os.getpid()} ({sys.executable}): EAGLE-3 patches NOT "
        "applied\n"
        f"  cause: {_reason}\n"
        + (
            "  EAGLE3_PATCHES_ON_ERROR=warn: sglang runs UNPATCHED in this process\n"
            if _explicit_warn
            else "  sglang will refuse to import in this process (set EAGLE3_PATCHES_ON_ERROR=warn to run it "
            "unpatched)\n"
        )
        + f"{_bar}\n"
    )
    if _on_error == "raise":
        raise
    if not _explicit_warn:
        sys.meta_path.insert(0, _RefuseSglang(_reason))
_chain()
