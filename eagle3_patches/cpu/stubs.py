"""Import-only stand-ins for CUDA-only packages sglang imports at module level.

They are installed only when the real package cannot be imported (so they never
shadow a real install), and every function they expose raises
``NotImplementedError`` when called: if sglang ever calls one on the CPU path,
the test that reaches it fails loudly instead of computing garbage.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import types
from typing import Any

logger = logging.getLogger("eagle3_patches")

STUB_MARKER = "__eagle3_patches_stub__"

#: attributes and submodules sglang must NOT find, so that it takes its own ``except ImportError`` fallbacks
_ABSENT = {
    "sgl_kernel": {"scalar_type", "scaled_fp4_quant"},
}


def _unavailable(qualname: str):
    def fn(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{qualname} is a CUDA kernel; eagle3-patches' CPU profile only provides an import-time "
            "stand-in for it. Run on a GPU with the real package installed."
        )

    fn.__name__ = fn.__qualname__ = qualname.rsplit(".", 1)[-1]
    setattr(fn, STUB_MARKER, True)
    return fn


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr in _ABSENT.get(self.__name__, ()):
            raise AttributeError(attr)
        value = _unavailable(f"{self.__name__}.{attr}")
        setattr(self, attr, value)
        return value


def _new_stub(name: str) -> Any:
    mod = _StubModule(name)
    mod.__path__ = []  # a package: submodules resolve through the finder
    mod.__spec__ = importlib.machinery.ModuleSpec(name, _StubFinder, is_package=True)  # type: ignore[arg-type]
    setattr(mod, STUB_MARKER, True)
    return mod


def _torchvision_stub() -> types.ModuleType:
    import enum

    tv = _new_stub("torchvision")
    transforms = _new_stub("torchvision.transforms")

    class InterpolationMode(enum.Enum):  # the one name sglang's configs use at import time
        NEAREST = "nearest"
        NEAREST_EXACT = "nearest-exact"
        BILINEAR = "bilinear"
        BICUBIC = "bicubic"
        BOX = "box"
        HAMMING = "hamming"
        LANCZOS = "lanczos"

    transforms.InterpolationMode = InterpolationMode
    # transformers >= 5.12 parses torchvision's version at import time ("N/A" for a module without one
    # raises InvalidVersion); a stand-in claims the oldest version, so no torchvision feature is chosen
    tv.__version__ = "0.0.0"
    tv.transforms = transforms
    sys.modules["torchvision.transforms"] = transforms
    return tv


_FACTORIES = {"sgl_kernel": lambda: _new_stub("sgl_kernel"), "torchvision": _torchvision_stub}
#: the CUDA-only packages the CPU profile stands in for (their absence on a CPU machine is expected)
STAND_INS = frozenset(_FACTORIES)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves submodules of an installed stub (``sgl_kernel.flash_attn`` ...)."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):  # noqa: D401
        root, _, rest = fullname.partition(".")
        if rest and rest.split(".")[0] not in _ABSENT.get(root, ()) and is_stub(sys.modules.get(root)):
            return importlib.machinery.ModuleSpec(fullname, cls, is_package=True)  # type: ignore[arg-type]
        return None

    @classmethod
    def invalidate_caches(cls) -> None:
        # sys.meta_path holds the class itself: importlib.invalidate_caches() (which transformers calls before it
        # loads a checkpoint's own code) calls this on it, and the inherited instance method would raise
        return None

    @classmethod
    def create_module(cls, spec):
        return _new_stub(spec.name)

    @classmethod
    def exec_module(cls, module):
        return None


def is_stub(obj: Any) -> bool:
    """A stand-in module, or a function taken from one."""
    return bool(obj is not None and getattr(obj, STUB_MARKER, False))


def real_module_importable(name: str) -> bool:
    """True when ``name`` is installed and imports cleanly (then no stand-in is used)."""
    if importlib.util.find_spec(name) is None:
        return False
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - e.g. sgl_kernel without libnvrtc, torchvision without CUDA torch
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        logger.info("eagle3-patches CPU profile: real %s does not import here (%s); using a stand-in", name, exc)
        return False
    return True


def install_stubs() -> list[str]:
    """Install the stand-ins that are needed; returns the names installed."""
    installed = []
    if _StubFinder not in sys.meta_path:
        sys.meta_path.append(_StubFinder)
    for name, factory in _FACTORIES.items():
        if is_stub(sys.modules.get(name)):
            continue
        if real_module_importable(name):
            continue
        sys.modules[name] = factory()
        installed.append(name)
    return installed
