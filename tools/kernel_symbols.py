#!/usr/bin/env python3
"""Which accelerator-only names sglang's speculative decode path can reach, per release, read from each release's
own source with ``ast`` (never imported, never run): the data that ``tests/cpu/test_kernel_coverage.py`` holds the
CPU profile's declaration (``eagle3_patches/cpu/kernel_coverage.py``) against.

    python tools/kernel_symbols.py                     # the matrix's releases: a summary, nothing written
    python tools/kernel_symbols.py --write             # ... -> tests/data/kernel_symbols.json
    python tools/kernel_symbols.py --check             # exit 1 when the committed data differs from the wheels
    python tools/kernel_symbols.py --releases 0.5.13 --explain sgl_kernel.top_k_renorm_prob   # its sites, and how
    python tools/kernel_symbols.py --installed         # the installed sglang's own files against the data

Wheels are read from ``--wheels DIR`` when there, else from ``.matrix/wheels`` (``pip download --no-deps``, as
tools/matrix.py keeps them); only their ``.py`` files are parsed.

**The path.** Every module of ``sglang/srt/speculative``, ``sglang/srt/speculative/triton_ops`` (0.5.13 - 0.5.15),
``sglang/kernels/ops/speculative`` and ``sglang/kernels/ops/sampling`` (not their sub-packages: DSpark, the ngram
corpus), and ``sglang/srt/layers/sampler.py``, whole; and each sglang function these call on CPU by name
(``from sglang.X import f`` then ``f``: the draft's ``fast_topk``, the allocator's ``assign_req_to_token_pool_func``)
with the functions of its own module it calls in turn (one step out of the path: further on is sglang's machinery,
the JIT compiler or the model runner).  Methods of other modules' classes (attention backends, the scheduler) are
not followed.

**A name** is one of:

* a name of an accelerator-only package (:data:`ACCELERATOR_PACKAGES`): imported from it (module level, under any
  ``if``, or inside a function), read as its attribute (``sgl_kernel.X``, ``torch.ops.sgl_kernel.X``,
  ``torch.ops.npu.X``), or named by a string (``LazyImport("flashinfer.sampling", "X")``, a kernel registry's
  ``target="sgl_kernel.sampling:X"``, then reached where ``get_kernel`` asks for its op);
* an in-tree CUDA JIT op: an sglang function that compiles its kernel with ``load_jit`` (0.5.21 on:
  ``sglang.kernels.ops.speculative.tree``, ``.sampling``);
* a module global a function reads that its module binds only off CPU (every binding under ``if _is_cuda:`` and the
  like): a ``NameError`` on CPU, 0.5.13's ``top_k_renorm_prob``; keyed by what it is bound to off CPU (the
  accelerator name), else ``sglang.<module>.<global>``.  One bound to ``None`` on CPU and to an accelerator name
  elsewhere counts the same where it is read other than in a test (``if X``, ``X is None``).

**Sites** are ``<module>:<function>`` (``sglang.`` left off; the module alone for module level), tagged
``import`` (an import statement), ``unbound on CPU``, ``None on CPU``.  Each is in one of three lists:

* ``live``: not ruled out on CPU;
* ``silent``: inside a function, under an ``if`` / ``elif`` chain over platforms none of whose branches CPU takes
  (``if _is_cuda: ... elif _is_npu: ...``, no ``else``): on CPU the function skips that work without a word (0.5.9's
  ``verify_tree_greedy_func`` returned its buffers untouched; 0.5.13's ``assign_extend_cache_locs_func``, whose
  branches all return, fell off its end and returned None);
* ``off``: CPU takes another branch (``if _is_cuda: sgl_kernel.f() else: torch_f()``; or every branch returns and
  the statements after the chain are CPU's way: ``if _is_cuda: return sgl_kernel.f(x)`` then ``return torch_f(x)``).

What is statically false on CPU: the CPU profile runs with ``SGLANG_USE_CPU_ENGINE=1`` (``is_cpu()``, ``_is_cpu``
true) and no accelerator (``is_cuda()``, ``_is_hip``, ``_use_aiter`` ... false: :data:`PLATFORM_CALLS`,
:data:`PLATFORM_FLAGS`); module constants made of these are followed across modules
(``TREE_SPEC_KERNEL_AVAILABLE = _is_cuda``), through ``not`` / ``and`` / ``or``, ``x if c else y``, and an earlier
``if c: return``.  Anything else (a request's temperature, a server argument) may go either way.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import sys
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "kernel_symbols.json"

#: packages (and ``torch.ops`` namespaces) that exist only for an accelerator: nothing in them runs on CPU
ACCELERATOR_PACKAGES = {
    "sgl_kernel": "CUDA",  # the CPU profile installs an import-only stand-in (eagle3_patches/cpu/stubs.py)
    "flashinfer": "CUDA",
    "flash_attn": "CUDA",
    "flash_mla": "CUDA",
    "deep_gemm": "CUDA",
    "aiter": "ROCm",
    "sgl_kernel_npu": "NPU",
    "torch_npu": "NPU",
}
TORCH_OPS_NAMESPACES = {"sgl_kernel": "CUDA", "npu": "NPU"}
#: the packages whose modules (not sub-packages) are scanned whole, and single modules scanned whole
WHOLE_PACKAGES = (
    "sglang.srt.speculative",
    "sglang.srt.speculative.triton_ops",
    "sglang.kernels.ops.speculative",
    "sglang.kernels.ops.sampling",
)
WHOLE_MODULES = ("sglang.srt.layers.sampler",)
#: never followed: the JIT compiler's entry (what it compiles is an op, a name of its own)
NOT_FOLLOWED = frozenset({"load_jit"})

#: platform predicates (called without arguments) and flags, as they are under the CPU profile
PLATFORM_CALLS = {
    "is_cpu": True,
    "is_cuda": False,
    "is_hip": False,
    "is_npu": False,
    "is_musa": False,
    "is_xpu": False,
    "is_mps": False,
    "is_hpu": False,
    "is_cuda_alike": False,
    "is_flashinfer_available": False,
    "is_sm90_supported": False,
    "is_sm100_supported": False,
    "is_blackwell": False,
    "is_blackwell_supported": False,
    "is_gfx95_supported": False,
    "is_gfx1250_supported": False,
    "torch.cuda.is_available": False,
}
PLATFORM_FLAGS = {
    "_is_cpu": True,
    "_is_cuda": False,
    "_is_hip": False,
    "_is_npu": False,
    "_is_musa": False,
    "_is_xpu": False,
    "_is_mps": False,
    "_is_cuda_alike": False,
    "_use_aiter": False,
    "TYPE_CHECKING": False,
}
_TARGET = re.compile(r"^([A-Za-z_]\w*)((?:\.\w+)*):(\w+)$")
LISTS = ("live", "silent", "off")
Sites = dict[str, list[str]]  # {"live": [...], "silent": [...], "off": [...]}


# -- sources ----------------------------------------------------------------------------------------------------------
class Source:
    """The ``.py`` files of one sglang tree by dotted module name: a wheel, or the directory holding ``sglang/``."""

    def __init__(self, paths: Iterable[tuple[str, Callable[[], str]]], label: str) -> None:
        self.label = label
        self.files: dict[str, Callable[[], str]] = {}
        self.packages: set[str] = set()
        for rel, reader in paths:
            if not rel.startswith("sglang/") or not rel.endswith(".py"):
                continue
            parts = rel[: -len(".py")].split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
                self.packages.add(".".join(parts))
            self.files[".".join(parts)] = reader

    @classmethod
    def wheel(cls, path: Path) -> Source:
        zf = zipfile.ZipFile(path)

        def reader(name: str) -> Callable[[], str]:
            return lambda: zf.read(name).decode("utf-8")

        return cls(((n, reader(n)) for n in zf.namelist()), path.name)

    @classmethod
    def directory(cls, site: Path) -> Source:
        def reader(p: Path) -> Callable[[], str]:
            return lambda: p.read_text("utf-8")

        return cls(((p.relative_to(site).as_posix(), reader(p)) for p in (site / "sglang").rglob("*.py")), str(site))


def installed_site() -> Path | None:
    """The directory holding the installed ``sglang/`` (found without importing sglang)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


# -- modules ----------------------------------------------------------------------------------------------------------
@dataclass
class Binding:
    kind: str  # "import" (from M import N), "import-module" (import M [as N]), "def", "class", "assign"
    source: str | None  # the dotted name imported
    on_cpu: bool  # False: under a branch that is statically not taken on CPU
    node: ast.AST | None = None
    value: ast.expr | None = None  # an assignment's value (a single target)


@dataclass
class Module:
    name: str
    tree: ast.Module
    is_pkg: bool
    bindings: dict[str, list[Binding]] = field(default_factory=dict)

    def absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = (self.name if self.is_pkg else self.name.rpartition(".")[0]).split(".")
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))


@dataclass(frozen=True)
class Terminal:
    """What a name is bound to, at the end of its chain of imports."""

    kind: str  # "accelerator", "accelerator-module", "jit", "function", "module", "none", "other"
    key: str
    module: str = ""
    name: str = ""


def _short(module: str) -> str:
    return module[len("sglang.") :] if module.startswith("sglang.") else module


def _accelerator(dotted: str) -> bool:
    return dotted.split(".")[0] in ACCELERATOR_PACKAGES


def _platform(key: str) -> str:
    if key.startswith("torch.ops."):
        return TORCH_OPS_NAMESPACES.get(key.split(".")[2], "")
    return ACCELERATOR_PACKAGES.get(key.split(".")[0], "CUDA")  # a JIT op is CUDA


def _terminates(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise))


def _lazy_import(node: ast.AST | None) -> str | None:
    """``LazyImport("flashinfer.sampling", "X")`` and the like: ``flashinfer.sampling.X``."""
    if not isinstance(node, ast.Call):
        return None
    strs = [a.value for a in node.args[:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if len(strs) == 2 and _accelerator(strs[0]) and strs[1].isidentifier():
        return f"{strs[0]}.{strs[1]}"
    return None


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _chain_has_cpu_branch(node: ast.If, truth: Callable[[ast.expr], bool | None], more: bool) -> bool:
    """Whether CPU has a way through ``if ... elif ... [else ...]``: a branch it may take, or, where every branch
    returns (``if _is_cuda: return kernel(x)``), the statements after the chain (``more``)."""
    all_return = True
    while True:
        if truth(node.test) is not False:
            return True
        all_return = all_return and _terminates(node.body)
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
            node = node.orelse[0]
            continue
        return bool(node.orelse) or (all_return and more)


class Analysis:
    """The names one sglang tree's speculative path can reach: :meth:`run`."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._modules: dict[str, Module | None] = {}
        self._jit: dict[tuple[str, str], bool] = {}
        self._consts: dict[tuple[str, str], bool | None] = {}
        self.sites: dict[str, dict[str, set[str]]] = {}
        self.kinds: dict[str, str] = {}
        self.registry: dict[str, str] = {}  # a kernel registry's op -> the accelerator name it resolves to
        self.whole: set[str] = set()
        self.via: dict[tuple[str, str], list[str]] = {}  # a followed function -> the sites that reach it
        self._queue: list[tuple[str, str]] = []

    # modules and their module-level bindings
    def module(self, name: str) -> Module | None:
        if name not in self._modules:
            self._modules[name] = None
            reader = self.source.files.get(name)
            if reader is None:
                return None
            try:
                tree = ast.parse(reader())
            except SyntaxError:
                return None
            mod = Module(name, tree, name in self.source.packages)
            self._modules[name] = mod
            self._collect(mod, tree.body, True)
        return self._modules[name]

    def _collect(self, mod: Module, body: list[ast.stmt], on_cpu: bool) -> None:
        def bind(name: str, b: Binding) -> None:
            mod.bindings.setdefault(name, []).append(b)

        for stmt in body:
            if isinstance(stmt, ast.If):
                t = self.truth(stmt.test, mod)
                self._collect(mod, stmt.body, on_cpu and t is not False)
                self._collect(mod, stmt.orelse, on_cpu and t is not True)
                if (t is True and _terminates(stmt.body)) or (t is False and _terminates(stmt.orelse)):
                    on_cpu = False
            elif isinstance(stmt, ast.Try):
                for part in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                    self._collect(mod, part, on_cpu)
            elif isinstance(stmt, (ast.With, ast.For, ast.While)):
                self._collect(mod, stmt.body, on_cpu)
                self._collect(mod, getattr(stmt, "orelse", []), on_cpu)
            elif isinstance(stmt, ast.ImportFrom):
                src = mod.absolute(stmt)
                for a in stmt.names:
                    if a.name != "*":
                        bind(a.asname or a.name, Binding("import", f"{src}.{a.name}", on_cpu, stmt))
            elif isinstance(stmt, ast.Import):
                for a in stmt.names:
                    target = a.name if a.asname else a.name.split(".")[0]
                    bind(a.asname or target, Binding("import-module", target, on_cpu, stmt))
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                bind(stmt.name, Binding("def", None, on_cpu, stmt))
            elif isinstance(stmt, ast.ClassDef):
                bind(stmt.name, Binding("class", None, on_cpu, stmt))
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for tgt in targets:
                    single = stmt.value if isinstance(tgt, ast.Name) and not isinstance(stmt, ast.AugAssign) else None
                    for n in ast.walk(tgt):
                        if isinstance(n, ast.Name):
                            bind(n.id, Binding("assign", None, on_cpu, stmt, single))

    # what a condition is on CPU
    def truth(self, expr: ast.expr, mod: Module | None) -> bool | None:
        if isinstance(expr, ast.Constant):
            return bool(expr.value) if expr.value is None or isinstance(expr.value, (bool, int, str)) else None
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
            v = self.truth(expr.operand, mod)
            return None if v is None else not v
        if isinstance(expr, ast.BoolOp):
            vals = [self.truth(v, mod) for v in expr.values]
            if isinstance(expr.op, ast.And):
                return False if False in vals else (True if all(v is True for v in vals) else None)
            return True if True in vals else (False if all(v is False for v in vals) else None)
        if isinstance(expr, ast.Call) and not expr.args and not expr.keywords:
            fn = ast.unparse(expr.func)
            for key in (fn, fn.rsplit(".", 1)[-1]):
                if key in PLATFORM_CALLS:
                    return PLATFORM_CALLS[key]
            return None
        if isinstance(expr, ast.Name):
            return self.constant(mod, expr.id) if mod is not None else PLATFORM_FLAGS.get(expr.id)
        if isinstance(expr, ast.Attribute) and expr.attr == "TYPE_CHECKING":
            return False
        return None

    def constant(self, mod: Module, name: str, depth: int = 0) -> bool | None:
        """A module global's truth on CPU where its module binds it from platform flags only (else None)."""
        key = (mod.name, name)
        if key in self._consts:
            return self._consts[key]
        self._consts[key] = PLATFORM_FLAGS.get(name)  # while it is worked out, and where nothing binds it
        found: set[bool | None] = set()
        for b in mod.bindings.get(name, []):
            if not b.on_cpu:
                continue
            if b.kind == "assign":
                found.add(self.truth(b.value, mod) if b.value is not None else None)
            elif b.kind == "import" and b.source and b.source.startswith("sglang.") and depth < 8:
                other = self.module(b.source.rpartition(".")[0])
                found.add(self.constant(other, b.source.rpartition(".")[2], depth + 1) if other else None)
            else:
                found.add(None)
        value = found.pop() if len(found) == 1 else (PLATFORM_FLAGS.get(name) if not found else None)
        self._consts[key] = value
        return value

    # what a name is bound to
    def is_jit(self, mod: Module, fname: str, seen: frozenset[str] = frozenset()) -> bool:
        """Function ``fname`` of ``mod`` compiles a CUDA kernel with ``load_jit``, itself or through another
        function of its module (``_jit_sampling_module``)."""
        key = (mod.name, fname)
        if key not in self._jit:
            result = False
            for b in mod.bindings.get(fname, []):
                for n in ast.walk(b.node) if b.kind == "def" and b.node is not None else []:
                    if not isinstance(n, ast.Call):
                        continue
                    callee = n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", None)
                    if callee == "load_jit":
                        result = True
                    elif (
                        isinstance(n.func, ast.Name)
                        and callee not in seen | {fname}
                        and any(x.kind == "def" for x in mod.bindings.get(n.func.id, []))
                    ):
                        result = self.is_jit(mod, n.func.id, seen | {fname})
                    if result:
                        break
            self._jit[key] = result
        return self._jit[key]

    def terminals(self, mod: Module, name: str, on_cpu: bool = True, depth: int = 0) -> list[Terminal]:
        """What ``name`` is bound to in ``mod``: on CPU (``on_cpu``), or on any platform."""
        out: list[Terminal] = []
        for b in mod.bindings.get(name, []):
            if on_cpu and not b.on_cpu:
                continue
            if b.kind == "import-module":
                assert b.source is not None
                out.append(Terminal("accelerator-module" if _accelerator(b.source) else "module", b.source))
            elif b.kind == "import":
                assert b.source is not None
                other = self.module(b.source.rpartition(".")[0]) if b.source.startswith("sglang.") else None
                if _accelerator(b.source):
                    out.append(Terminal("accelerator", b.source))
                elif b.source in self.source.files:
                    out.append(Terminal("module", b.source))
                elif other is not None and depth < 8:
                    out += self.terminals(other, b.source.rpartition(".")[2], on_cpu, depth + 1)
                else:
                    out.append(Terminal("other", b.source))
            elif b.kind == "def":
                kind = "jit" if self.is_jit(mod, name) else "function"
                out.append(Terminal(kind, f"{mod.name}.{name}", mod.name, name))
            elif b.kind == "assign" and isinstance(b.value, ast.Constant) and b.value.value is None:
                out.append(Terminal("none", f"{mod.name}.{name}"))
            elif b.kind == "assign" and _lazy_import(b.value):
                out.append(Terminal("accelerator", _lazy_import(b.value) or ""))
            else:
                out.append(Terminal("other", f"{mod.name}.{name}"))
        return out

    # sites
    def add(self, name: str, kind: str, site: str, where: str) -> None:
        self.kinds.setdefault(name, kind)
        self.sites.setdefault(name, {k: set() for k in LISTS})[where].add(site)

    def follow(self, module: str, fname: str, caller: str | None, site: str) -> None:
        """Walk function ``fname`` of ``module`` too: the path (``caller`` None) or a function followed into that
        module reaches it on CPU."""
        if caller is not None and caller != module:
            return
        if module in self.whole or fname in NOT_FOLLOWED:
            return
        if (module, fname) not in self.via:
            self._queue.append((module, fname))
        self.via.setdefault((module, fname), []).append(site)

    def run(self) -> dict[str, Sites]:
        self.whole = {
            name
            for name in self.source.files
            if name in WHOLE_MODULES
            or name in WHOLE_PACKAGES
            or (name.rpartition(".")[0] in WHOLE_PACKAGES and name not in self.source.packages)
        }
        mods = [m for m in (self.module(n) for n in sorted(self.whole)) if m is not None]
        for mod in mods:  # the kernel registries first: get_kernel("op") may be read before register_kernel runs
            for n in ast.walk(mod.tree):
                if isinstance(n, ast.Call):
                    kw = {k.arg: k.value.value for k in n.keywords if isinstance(k.value, ast.Constant)}
                    m = _TARGET.match(str(kw.get("target", "")))
                    if isinstance(kw.get("op"), str) and m and m.group(1) in ACCELERATOR_PACKAGES:
                        self.registry[str(kw["op"])] = f"{m.group(1)}{m.group(2)}.{m.group(3)}"
        for mod in mods:
            _Walker(self, mod, None).stmts(mod.tree.body, _Reach(True, False))
        while self._queue:
            mname, fname = self._queue.pop(0)
            followed = self.module(mname)
            if followed is None:
                continue
            for b in followed.bindings.get(fname, []):
                if b.kind == "def" and b.on_cpu and isinstance(b.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    _Walker(self, followed, mname).function(b.node, fname, _Reach(True, False))
        return {k: {w: sorted(v[w]) for w in LISTS} for k, v in sorted(self.sites.items())}


@dataclass(frozen=True)
class _Reach:
    live: bool  # CPU may get here
    silent: bool  # CPU does not, because no branch of a platform chain is CPU's (see the module docstring)

    def under(self, taken: bool | None, cpu_branch: bool, in_function: bool) -> _Reach:
        """Inside a branch whose truth on CPU is ``taken`` (None: either), of a chain with (or without) a CPU
        branch."""
        if not self.live or taken is not False:
            return self
        return _Reach(False, in_function and not cpu_branch)

    @property
    def where(self) -> str:
        return "live" if self.live else ("silent" if self.silent else "off")


OFF = _Reach(False, False)


def _local_names(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """The names a function binds itself (parameters, assignments, imports, nested definitions)."""
    a = fn.args
    out = {arg.arg for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if arg is not None}
    declared: set[str] = set()
    for n in ast.walk(fn):
        if n is fn:
            continue
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out.update((al.asname or al.name).split(".")[0] for al in n.names)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            declared.update(n.names)
    return out - declared


class _Walker:
    """Walks a module, or a function followed into it, with what CPU does at each point (:class:`_Reach`)."""

    def __init__(self, an: Analysis, mod: Module, followed: str | None) -> None:
        self.an, self.mod, self.followed = an, mod, followed
        self.locals: list[set[str]] = []
        self.local_packages: list[dict[str, str]] = []  # per function: local name -> accelerator package imported
        self.qual: list[str] = []
        self.in_function = 0
        self.jit_scope = False

    def truth(self, expr: ast.expr) -> bool | None:
        return self.an.truth(expr, self.mod)

    @property
    def site(self) -> str:
        return f"{_short(self.mod.name)}:{'.'.join(self.qual)}" if self.qual else _short(self.mod.name)

    def add(self, name: str, kind: str, tags: list[str], reach: _Reach) -> None:
        self.an.add(name, kind, self.site + (f" [{', '.join(tags)}]" if tags else ""), reach.where)

    def function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, qual: str, reach: _Reach) -> None:
        for d in [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]:
            self.expr(d, reach)
        self.qual.append(qual)
        self.locals.append(_local_names(node))
        self.local_packages.append({})
        self.in_function += 1
        outer_jit = self.jit_scope
        self.jit_scope = outer_jit or (not isinstance(node, ast.Lambda) and self.an.is_jit(self.mod, qual))
        if isinstance(node, ast.Lambda):
            self.expr(node.body, reach)
        else:
            self.stmts(node.body, reach)
        self.jit_scope = outer_jit
        self.in_function -= 1
        self.local_packages.pop()
        self.locals.pop()
        self.qual.pop()

    def stmts(self, body: list[ast.stmt], reach: _Reach) -> None:
        for i, stmt in enumerate(body):
            reach = self.stmt(stmt, reach, more=i + 1 < len(body))

    def stmt(self, stmt: ast.stmt, reach: _Reach, more: bool = False) -> _Reach:
        """Walk ``stmt`` (``more``: statements follow it); returns what CPU does at the statement after it."""
        fn = self.in_function > 0
        if isinstance(stmt, ast.If):
            t = self.truth(stmt.test)
            cpu_branch = _chain_has_cpu_branch(stmt, self.truth, more)
            self.test(stmt.test, reach)
            self.stmts(stmt.body, reach.under(t, cpu_branch, fn))
            self.stmts(stmt.orelse, reach.under(None if t is None else not t, cpu_branch, fn))
            if (t is True and _terminates(stmt.body)) or (t is False and _terminates(stmt.orelse)):
                return reach.under(False, True, fn)
            return reach
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in stmt.decorator_list:
                self.expr(d, reach)
            self.function(stmt, stmt.name, reach)
            return reach
        if isinstance(stmt, ast.ClassDef):
            for e in (*stmt.bases, *stmt.decorator_list, *(k.value for k in stmt.keywords)):
                self.expr(e, reach)
            self.qual.append(stmt.name)
            self.stmts(stmt.body, reach)
            self.qual.pop()
            return reach
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            self.imports(stmt, reach)
            return reach
        if isinstance(stmt, ast.While):
            self.test(stmt.test, reach)
        for child in ast.iter_child_nodes(stmt):
            if isinstance(child, ast.expr) and not (isinstance(stmt, ast.While) and child is stmt.test):
                self.expr(child, reach)
            elif isinstance(child, ast.withitem):
                self.expr(child.context_expr, reach)
                if child.optional_vars is not None:
                    self.expr(child.optional_vars, reach)
            elif isinstance(child, ast.ExceptHandler):
                if child.type is not None:
                    self.expr(child.type, reach)
                self.stmts(child.body, reach)
            elif isinstance(child, ast.match_case):
                if child.guard is not None:
                    self.expr(child.guard, reach)
                self.stmts(child.body, reach)
        for part in ("body", "orelse", "finalbody"):
            sub = getattr(stmt, part, None)
            if isinstance(sub, list):
                self.stmts(sub, reach)
        return reach

    def imports(self, stmt: ast.Import | ast.ImportFrom, reach: _Reach) -> None:
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                if _accelerator(a.name):
                    self.add(a.name, a.name.split(".")[0], ["import"], reach)
                    if self.local_packages:
                        local = a.asname or a.name.split(".")[0]
                        self.local_packages[-1][local] = a.name if a.asname else local
            return
        src = self.mod.absolute(stmt)
        for a in stmt.names:
            dotted = f"{src}.{a.name}"
            if a.name == "*":
                continue
            if _accelerator(dotted):
                self.add(dotted, dotted.split(".")[0], ["import"], reach)
            elif dotted.startswith("sglang.") and dotted not in self.an.source.files:
                other = self.an.module(src)
                for t in self.an.terminals(other, a.name) if other is not None else []:
                    if t.kind == "jit" or self.in_function:
                        # a JIT op is named where it is imported, as a package's name is; an import inside a
                        # function binds a local name, so the import is where the function reaches what it names
                        self.terminal(t, reach, ["import"])

    def terminal(self, t: Terminal, reach: _Reach, tags: list[str]) -> None:
        if t.kind == "accelerator":
            self.add(t.key, t.key.split(".")[0], tags, reach)
        elif t.kind == "jit" and not (self.jit_scope and t.module == self.mod.name):  # not a JIT op's own helpers
            self.add(t.key, "jit", tags, reach)
        elif t.kind == "function" and reach.live:
            self.an.follow(t.module, t.name, self.followed, self.site)

    def is_local(self, name: str) -> bool:
        return any(name in scope for scope in self.locals)

    def test(self, node: ast.expr, reach: _Reach) -> None:
        """A condition: a name read only for its truth (``if X``, ``X is None``) is not a call of what it holds."""
        if isinstance(node, ast.Name):
            self.name(node.id, reach, tested=True)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self.test(node.operand, reach)
        elif isinstance(node, ast.BoolOp):
            for v in node.values:
                self.test(v, reach)
                t = self.truth(v)
                if (isinstance(node.op, ast.And) and t is False) or (isinstance(node.op, ast.Or) and t is True):
                    reach = reach.under(False, True, self.in_function > 0)
        elif (
            isinstance(node, ast.Compare)
            and all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)
            and any(isinstance(c, ast.Constant) and c.value is None for c in (node.left, *node.comparators))
        ):
            for c in (node.left, *node.comparators):
                self.test(c, reach)
        else:
            self.expr(node, reach)

    def expr(self, node: ast.expr, reach: _Reach) -> None:
        fn = self.in_function > 0
        if isinstance(node, ast.IfExp):
            t = self.truth(node.test)
            self.test(node.test, reach)
            self.expr(node.body, reach.under(t, True, fn))
            self.expr(node.orelse, reach.under(None if t is None else not t, True, fn))
            return
        if isinstance(node, ast.BoolOp) or (isinstance(node, ast.Compare) and _is_none_test(node)):
            self.test(node, reach)
            return
        if isinstance(node, ast.Lambda):
            self.function(node, "<lambda>", reach)
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            self.locals.append({n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)})
            self._children(node, reach)
            self.locals.pop()
            return
        if isinstance(node, ast.Constant):
            m = _TARGET.match(node.value) if isinstance(node.value, str) else None
            key = f"{m.group(1)}{m.group(2)}.{m.group(3)}" if m else ""
            if m and m.group(1) in ACCELERATOR_PACKAGES and key not in self.an.registry.values():
                self.add(key, m.group(1), [], reach)  # a registry's target is reached where get_kernel asks for it
            return
        if isinstance(node, ast.Call):
            lazy = _lazy_import(node)
            if lazy:
                self.add(lazy, lazy.split(".")[0], [], reach)
            callee = _dotted(node.func) or ""
            first = node.args[0] if node.args else None
            if callee.rsplit(".", 1)[-1] == "get_kernel" and isinstance(first, ast.Constant):
                registered = self.an.registry.get(str(first.value))
                if registered:
                    self.add(registered, registered.split(".")[0], [], reach)
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted is not None and dotted.startswith("torch.ops."):
                parts = dotted.split(".")
                if len(parts) >= 4 and parts[2] in TORCH_OPS_NAMESPACES:
                    self.add(".".join(parts[:4]), ".".join(parts[:3]), [], reach)
                return
            if dotted is not None and self.attribute(dotted, reach):
                return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            self.name(node.id, reach)
            return
        self._children(node, reach)

    def _children(self, node: ast.AST, reach: _Reach) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child, reach)
            elif isinstance(child, ast.keyword):
                self.expr(child.value, reach)
            elif isinstance(child, ast.comprehension):
                for sub in (child.target, child.iter, *child.ifs):
                    self.expr(sub, reach)

    def attribute(self, dotted: str, reach: _Reach) -> bool:
        """``a.b...`` where ``a`` is a module: an accelerator package's name, or a function of an sglang module
        (followed).  True when handled."""
        head, _, rest = dotted.partition(".")
        attr = rest.split(".")[0]
        if not rest:
            return False
        for scope in reversed(self.local_packages):  # import sgl_kernel inside the function, then sgl_kernel.f
            if head in scope:
                self.add(f"{scope[head]}.{attr}", scope[head].split(".")[0], [], reach)
                return True
        if self.is_local(head):
            return False
        bindings = self.mod.bindings.get(head, [])
        unbound = bool(bindings) and not any(b.on_cpu for b in bindings)
        terms = self.an.terminals(self.mod, head, on_cpu=not unbound)
        packages = [t for t in terms if t.kind == "accelerator-module"]
        modules = [t for t in terms if t.kind == "module"] if not unbound else []
        if not packages and not modules:
            return False
        for t in packages:
            if self.qual or not unbound:  # (module level: read under the same kind of branch that binds it)
                self.add(f"{t.key}.{attr}", t.key.split(".")[0], ["unbound on CPU"] if unbound else [], reach)
        for t in modules:
            other = self.an.module(t.key)
            for tt in self.an.terminals(other, attr) if other is not None else []:
                self.terminal(tt, reach, [])
        return True

    def name(self, name: str, reach: _Reach, tested: bool = False) -> None:
        if self.is_local(name):
            return
        bindings = self.mod.bindings.get(name)
        if not bindings:
            return
        bound = any(b.on_cpu for b in bindings)
        on_cpu = self.an.terminals(self.mod, name) if bound else []
        if bound and not (on_cpu and all(t.kind == "none" for t in on_cpu)):
            for t in on_cpu:
                self.terminal(t, reach, [])
            return
        if not self.qual or (bound and tested):
            return  # module level: read under the same kind of branch that binds it; or only tested for None
        # bound only off CPU (a NameError here), or to None on CPU
        tag = "None on CPU" if bound else "unbound on CPU"
        keyed = [t for t in self.an.terminals(self.mod, name, on_cpu=False) if t.kind in ("accelerator", "jit")]
        keyed += [
            Terminal("accelerator", t.key)
            for t in self.an.terminals(self.mod, name, False)
            if t.kind == "accelerator-module"
        ]
        cuda = [t for t in keyed if _platform(t.key) == "CUDA"]
        for t in sorted(set(cuda or keyed), key=lambda t: t.key):
            self.add(t.key, "jit" if t.kind == "jit" else t.key.split(".")[0], [tag], reach)
        if not keyed and not bound:
            self.add(f"{self.mod.name}.{name}", "sglang", [tag], reach)


def _is_none_test(node: ast.Compare) -> bool:
    return all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and any(
        isinstance(c, ast.Constant) and c.value is None for c in (node.left, *node.comparators)
    )


def analyse(source: Source) -> tuple[dict[str, Sites], dict[str, str]]:
    """``({name: {"live": [...], "silent": [...], "off": [...]}}, {name: kind})`` for one sglang tree."""
    an = Analysis(source)
    return an.run(), an.kinds


# -- the data file ----------------------------------------------------------------------------------------------------
DOC = (
    "Written by `python tools/kernel_symbols.py --write` from each release's wheel (ast; nothing imported), never by "
    "hand; read by tests/cpu/test_kernel_coverage.py against eagle3_patches/cpu/kernel_coverage.py. 'releases': each "
    "release and the wheel read. 'names': each accelerator-only name sglang's speculative path can reach, its kind "
    "(the package; 'jit': an in-tree CUDA JIT op; 'sglang': a global bound only off CPU), and runs of consecutive "
    "releases with the same sites: 'live' (CPU may reach it), 'silent' (off CPU, in a function with no CPU branch: "
    "CPU skips the work), 'off' (CPU takes another branch). tools/kernel_symbols.py's docstring says how."
)


def build(results: dict[str, tuple[str, dict[str, Sites], dict[str, str]]]) -> dict:
    """The data file from ``{release: (wheel file, sites, kinds)}``, releases in order."""
    releases = list(results)
    names: dict[str, dict] = {}
    for name in sorted({n for _, found, _ in results.values() for n in found}):
        runs: list[dict] = []
        prev = None
        for r in releases:
            found = results[r][1].get(name)
            if (
                found is not None
                and runs
                and prev == runs[-1]["releases"][-1]
                and all(runs[-1][w] == found[w] for w in LISTS)
            ):
                runs[-1]["releases"].append(r)
            elif found is not None:
                runs.append({"releases": [r], **found})
            prev = r
        kind = next(results[r][2][name] for r in releases if name in results[r][2])
        names[name] = {"kind": kind, "runs": runs}
    return {"_doc": DOC, "releases": {r: results[r][0] for r in releases}, "names": names}


def load(path: Path = DATA) -> dict:
    return json.loads(path.read_text())


def for_release(data: dict, release: str) -> dict[str, Sites]:
    """The entries of one release of the data, in :func:`analyse`'s form."""
    out = {}
    for name, entry in data["names"].items():
        for run in entry["runs"]:
            if release in run["releases"]:
                out[name] = {w: run[w] for w in LISTS}
    return out


def dump(data: dict) -> str:
    return json.dumps(data, indent=1) + "\n"


def differences(expected: dict[str, Sites], found: dict[str, Sites]) -> list[str]:
    """``+`` what ``found`` has and ``expected`` has not, ``-`` the reverse."""
    out = []
    for name in sorted(set(expected) | set(found)):
        a, b = expected.get(name, {}), found.get(name, {})
        for w in LISTS:
            out += [f"+ {name} {w}: {s}" for s in sorted(set(b.get(w, [])) - set(a.get(w, [])))]
            out += [f"- {name} {w}: {s}" for s in sorted(set(a.get(w, [])) - set(b.get(w, [])))]
    return out


# -- command line -----------------------------------------------------------------------------------------------------
def wheel(version: str, dirs: list[Path]) -> Path:
    for d in dirs:
        found = sorted(d.glob(f"sglang-{version}-*.whl"))
        if found:
            return found[0]
    import matrix  # noqa: PLC0415  (tools/ is on sys.path; the wheel cache .matrix/wheels is the matrix's)

    return matrix.wheel_for(version, sys.executable)


def releases_of(spec: str | None) -> list[str]:
    if spec:
        return [r.strip() for r in spec.split(",") if r.strip()]
    import matrix  # noqa: PLC0415

    data = matrix.load_data()
    return matrix.resolve_releases(data["full"], data, newest="known")


def spans(releases: list[str], chosen: Iterable[str]) -> str:
    """``0.5.9-0.5.12, 0.5.14``: ``chosen`` as runs of consecutive ``releases``."""
    idx = sorted(releases.index(r) for r in set(chosen))
    runs: list[list[int]] = []
    for i in idx:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(releases[r[0]] if len(r) == 1 else f"{releases[r[0]]}-{releases[r[-1]]}" for r in runs)


def summary(data: dict) -> str:
    """Each name, its kind, and the releases where it is live / silent / off CPU only."""
    releases = list(data["releases"])
    lines = ["| name | kind | live on CPU | silent on CPU | off CPU only |", "|---|---|---|---|---|"]
    for name, entry in data["names"].items():
        runs = entry["runs"]
        live = [r for run in runs if run["live"] for r in run["releases"]]
        silent = [r for run in runs if run["silent"] for r in run["releases"]]
        off = [r for run in runs if not run["live"] and not run["silent"] for r in run["releases"]]
        cells = (spans(releases, x) for x in (live, silent, off))
        lines.append(f"| `{name}` | {entry['kind']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def coverage(data: dict) -> str:
    """Each name reached on CPU, per run of releases: how eagle3_patches/cpu/kernel_coverage.py serves each site."""
    sys.path.insert(0, str(ROOT))
    from eagle3_patches.cpu import kernel_coverage as cov  # noqa: PLC0415

    releases = list(data["releases"])
    lines = ["| name | releases | site (live / silent) | on CPU |", "|---|---|---|---|"]
    for name, entry in data["names"].items():
        rows: dict[tuple[str, str], list[str]] = {}
        for run in entry["runs"]:
            for w in ("live", "silent"):
                for site in run[w]:
                    for r in run["releases"]:
                        how = ", ".join(map(cov.describe, cov.covering(name, r, site))) or "**NOT DECLARED**"
                        loc = site.split(" [")[0] + (" (silent)" if w == "silent" else "")
                        rows.setdefault((loc, how), []).append(r)
        for (loc, how), rs in sorted(rows.items(), key=lambda kv: (releases.index(kv[1][0]), kv[0])):
            lines.append(f"| `{name}` | {spans(releases, rs)} | `{loc}` | {how} |")
    return "\n".join(lines)


def explain(source: Source, name: str) -> str:
    """``name``'s sites in one tree, each followed function with the sites that reach it (first of them, on up)."""
    an = Analysis(source)
    found = an.run().get(name)
    if found is None:
        return "  not reached"
    lines = []
    for w in LISTS:
        for site in found[w]:
            lines.append(f"  {w:6} {site}")
            module, _, qual = site.split(" [")[0].partition(":")
            key = ("sglang." + module, qual.split(".")[0])
            while key in an.via and len(lines) < 200:
                callers = sorted(set(an.via[key]))
                lines.append("           <- " + " | ".join(callers))
                module, _, qual = callers[0].partition(":")
                key = ("sglang." + module, qual.split(".")[0])
    return "\n".join(lines)


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT / "tools"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--releases", help="comma list (default: the full matrix's releases, tools/matrix_releases.json)")
    ap.add_argument(
        "--wheels", type=Path, action="append", default=[], help="a directory of sglang wheels to use first"
    )
    ap.add_argument("--write", action="store_true", help=f"write {_rel(DATA)} (all the releases of the matrix)")
    ap.add_argument("--check", action="store_true", help="exit 1 when the committed data differs from the wheels")
    ap.add_argument("--installed", action="store_true", help="compare the installed sglang's own files with the data")
    ap.add_argument(
        "--explain", metavar="NAME", help="print NAME's sites per release, and how followed ones are reached"
    )
    ap.add_argument("--coverage", action="store_true", help="print how the CPU profile serves each site of the data")
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args(argv)

    if args.coverage:
        print(coverage(load(args.data)))
        return 0

    if args.installed:
        from importlib.metadata import version as dist_version

        site = installed_site()
        if site is None:
            print("sglang is not installed", file=sys.stderr)
            return 2
        release = dist_version("sglang")
        diff = differences(for_release(load(args.data), release), analyse(Source.directory(site))[0])
        print("\n".join(diff) or f"sglang {release} ({site}): as {_rel(args.data)} says")
        return 1 if diff else 0
    if args.write and args.releases:
        ap.error("--write writes every release of the matrix; leave --releases out")

    results = {}
    for r in releases_of(args.releases):
        source = Source.wheel(wheel(r, args.wheels))
        if args.explain:
            print(f"== {r}\n{explain(source, args.explain)}")
            continue
        results[r] = (source.label, *analyse(source))
    if args.explain:
        return 0
    data = build(results)
    if args.check:
        committed = load(args.data)
        bad = []
        for r, (_, found, _) in results.items():
            if r not in committed["releases"]:
                bad.append(f"{r}: not in the data")
            else:
                bad += [f"{r}: {d}" for d in differences(for_release(committed, r), found)]
        if not args.releases:
            bad += [f"{r}: in the data, not a release of the matrix" for r in committed["releases"] if r not in results]
        if bad:
            print("\n".join(bad))
            print(f"{_rel(args.data)} differs from the wheels: python tools/kernel_symbols.py --write")
            return 1
        print(f"{_rel(args.data)}: as the wheels say ({', '.join(results)})")
        return 0
    if args.write:
        args.data.write_text(dump(data))
        print(f"wrote {_rel(args.data)} ({', '.join(results)})")
    print(summary(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
