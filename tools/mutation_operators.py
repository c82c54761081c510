"""This project's mutation operators (tools/mutation.py registers them with cosmic-ray as the ``eagle3`` provider).

Each operator makes a kind of fault that real refactors introduce and that cosmic-ray's own operators never make:
a fault found surviving in this code by hand-written mutations before these operators existed.  An operator is a
plain class with cosmic-ray's operator interface (``mutation_positions(node)``, ``mutate(node, index)``,
``examples()``) over parso's tree, and imports nothing but parso: the tests check each one (its examples, and the
mutant it makes of the line of this package that it was written for) without cosmic-ray, which is a maintainer
tool and not a test dependency.  :func:`mutate_code` walks a tree the way cosmic-ray's ``MutationVisitor`` does
(pre-order, one occurrence counted across the module), so what the tests see is what a session runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import parso
from parso.python import tree

Position = tuple[tuple[int, int], tuple[int, int]]


def _replacement(node: Any, text: str) -> Any:
    """A node for ``text`` that keeps ``node``'s leading whitespace and comments."""
    return parso.parse(node.get_first_leaf().prefix + text)


def _code(node: Any) -> str:
    return node.get_code(include_prefix=False)


def _is_call(trailer: Any) -> bool:
    return trailer.type == "trailer" and trailer.children[0].value == "("


def _is_attribute(trailer: Any, names: frozenset[str] | None = None) -> bool:
    return (
        trailer.type == "trailer"
        and trailer.children[0].value == "."
        and (names is None or trailer.children[1].value in names)
    )


class DeleteCallStatement:
    """A statement that is only a call (``_verify(...)``, ``saver.wrap(...)``, ``out.add(...)``) becomes ``pass``."""

    fault = "a check or registration that is no longer called"

    def mutation_positions(self, node: Any) -> Iterator[Position]:
        if (
            node.type == "atom_expr"
            and node.parent is not None
            and node.parent.type == "simple_stmt"
            and _is_call(node.children[-1])
        ):
            yield (node.start_pos, node.end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        return _replacement(node, "pass")

    @classmethod
    def examples(cls) -> tuple[tuple[str, str], ...]:
        return (("f(x)\n", "pass\n"),)


class DropLiteralElement:
    """One element dropped from a literal tuple / list / set (a ``frozenset({...})`` too) whose elements are all
    strings, numbers or module constants (the hooks a wrapper delegates, the algorithms a guard covers, the forward
    modes it checks, the backends a rule names)."""

    fault = "a case forgotten from a list of names"

    @staticmethod
    def _elements(node: Any) -> list[Any] | None:
        if node.type != "atom" or len(node.children) != 3 or node.children[0].type != "operator":
            return None
        inner = node.children[1]
        if inner.type not in ("testlist_comp", "dictorsetmaker"):
            return None
        items = [c for c in inner.children if not (c.type == "operator" and c.value == ",")]
        if len(items) < 2 or not all(DropLiteralElement._constant(c) for c in items):
            return None
        return items

    @staticmethod
    def _constant(node: Any) -> bool:
        """A string, a number or a module constant (``FOO``, ``mod.FOO``): a member of a table, not a computed value."""
        if node.type in ("string", "number"):
            return True
        if node.type == "name":
            return bool(DropLiteralElement.CONSTANT.match(node.value))
        if node.type == "atom_expr" and all(_is_attribute(t) for t in node.children[1:]):
            return bool(DropLiteralElement.CONSTANT.match(node.children[-1].children[1].value))
        return False

    CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]*$")

    def mutation_positions(self, node: Any) -> Iterator[Position]:
        for item in self._elements(node) or ():
            yield (item.start_pos, item.end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        items = self._elements(node) or []
        kept = [_code(c) for i, c in enumerate(items) if i != index]
        opening, closing = node.children[0].value, node.children[2].value
        comma = "," if opening == "(" and len(kept) == 1 else ""
        return _replacement(node, f"{opening}{', '.join(kept)}{comma}{closing}")

    @classmethod
    def examples(cls) -> tuple[tuple[str, str], ...]:
        return (('("a", "b")\n', '("b",)\n'),)


class DropNormalisation:
    """A setting read as the user wrote it: one ``.strip()`` / ``.lower()`` / ``.casefold()`` / ``.upper()`` dropped
    from a chain, so ``" Off "`` or ``RAISE`` is compared as a raw string."""

    fault = "a parsed setting compared as a raw string"
    NAMES = frozenset({"strip", "lstrip", "rstrip", "lower", "upper", "casefold"})

    def _sites(self, node: Any) -> list[int]:
        if node.type != "atom_expr":
            return []
        kids = node.children
        return [
            i
            for i in range(1, len(kids) - 1)
            if _is_attribute(kids[i], self.NAMES) and _is_call(kids[i + 1]) and len(kids[i + 1].children) == 2
        ]

    def mutation_positions(self, node: Any) -> Iterator[Position]:
        for i in self._sites(node):
            yield (node.children[i].start_pos, node.children[i + 1].end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        i = self._sites(node)[index]
        kids = node.children
        return _replacement(
            node, "".join(_code(k) if n == 0 else k.get_code() for n, k in enumerate(kids[:i] + kids[i + 2 :]))
        )

    @classmethod
    def examples(cls) -> tuple[tuple[str, str], ...]:
        return (
            ("v = raw.strip().lower()\n", "v = raw.lower()\n"),
            ("v = raw.strip().lower()\n", "v = raw.strip()\n", 1),
        )


class DropPathSeparator:
    """A path containment check without its separator: ``root + os.sep`` (or ``+ "/"``) becomes ``root``, and
    ``p.is_relative_to(root)`` becomes ``str(p).startswith(str(root))``, so ``/models/draft-private`` counts as
    inside ``/models/draft``."""

    fault = "a path containment check without its separator"
    SEPARATORS = frozenset({"os.sep", "os.path.sep", '"/"', "'/'"})

    def _site(self, node: Any) -> str | None:
        if node.type == "arith_expr":
            kids = node.children
            if len(kids) >= 3 and kids[-2].value == "+" and _code(kids[-1]) in self.SEPARATORS:
                return "".join(_code(k) if n == 0 else k.get_code() for n, k in enumerate(kids[:-2]))
        if node.type == "atom_expr" and len(node.children) >= 3:
            *head, attr, call = node.children
            if _is_attribute(attr, frozenset({"is_relative_to"})) and _is_call(call) and len(call.children) == 3:
                inner = "".join(_code(k) if n == 0 else k.get_code() for n, k in enumerate(head))
                return f"str({inner}).startswith(str({_code(call.children[1])}))"
        return None

    def mutation_positions(self, node: Any) -> Iterator[Position]:
        if self._site(node) is not None:
            yield (node.start_pos, node.end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        return _replacement(node, self._site(node) or _code(node))

    @classmethod
    def examples(cls) -> tuple[tuple[str, str], ...]:
        return (
            ("ok = p.startswith(root + os.sep)\n", "ok = p.startswith(root)\n"),
            ("ok = p.is_relative_to(root)\n", "ok = str(p).startswith(str(root))\n"),
        )


class SwapAnyAll:
    """``any(...)`` becomes ``all(...)`` and the reverse: a "some element" check made an "every element" one."""

    fault = "any made all (and all made any)"
    SWAP = {"any": "all", "all": "any"}

    def mutation_positions(self, node: Any) -> Iterator[Position]:
        if (
            node.type == "atom_expr"
            and node.children[0].type == "name"
            and node.children[0].value in self.SWAP
            and _is_call(node.children[1])
        ):
            yield (node.children[0].start_pos, node.children[0].end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        name = node.children[0]
        rest = "".join(k.get_code() for k in node.children[1:])
        return _replacement(node, self.SWAP[name.value] + rest)

    @classmethod
    def examples(cls) -> tuple[tuple[str, str], ...]:
        return (("ok = any(x for x in xs)\n", "ok = all(x for x in xs)\n"),)


class IgnoreArgument:
    """One use of a parameter that has a default replaced by that default, in the function that takes it: the
    caller's argument ignored in favour of the default it was meant to override (``env=None`` read as ``None``,
    ``root=ROOT`` read as ``ROOT``)."""

    fault = "an argument ignored in favour of its default"

    @staticmethod
    def _default(name: Any) -> str | None:
        if name.type != "name" or name.is_definition() or name.parent.type == "param":
            return None
        parent = name.parent
        if parent.type == "trailer" and parent.children[0].value == ".":
            return None  # an attribute of the same name
        if parent.type == "argument" and parent.children[0] is name and parent.children[1] == "=":
            return None  # a keyword argument of the same name
        scope = name.parent
        while scope is not None and scope.type not in ("funcdef", "lambdef", "classdef", "file_input"):
            scope = scope.parent
        if scope is None or scope.type not in ("funcdef", "lambdef"):
            return None
        for param in scope.get_params():
            if param.name.value == name.value:
                return None if param.default is None else _code(param.default)
        return None

    def mutation_positions(self, node: Any) -> Iterator[Position]:
        if self._default(node) is not None:
            yield (node.start_pos, node.end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        return _replacement(node, self._default(node) or node.value)

    @classmethod
    def examples(cls) -> tuple[tuple[str, str], ...]:
        return (("def f(env=None):\n    return load(env)\n", "def f(env=None):\n    return load(None)\n"),)


class ShiftEmptinessBoundary:
    """An emptiness check made a size check one element off: ``not rows`` becomes ``len(rows) <= 1``, a condition
    ``if rows:`` becomes ``if len(rows) > 1:``, and ``len(x) == 0`` / ``x.numel() == 0`` / ``x.shape[0] == 0``
    becomes ``<= 1`` (``> 0``, ``!= 0`` and ``>= 1`` become ``> 1``)."""

    fault = "a size guard's boundary moved on an emptiness check"
    SIZED = re.compile(r"^(len\(.+\)|.+\.numel\(\)|.+\.shape\[\d+\]|.+\.size\(\d*\))$", re.S)
    SHIFT = {("==", "0"): "<= 1", (">", "0"): "> 1", ("!=", "0"): "> 1", (">=", "1"): "> 1"}

    #: names of flags, not of collections: ``len()`` of one only makes a TypeError, which any test kills
    FLAG = re.compile(r"^(is|has|use|can|should|enable)_|_(enabled|ok)$")

    def _operand(self, node: Any) -> bool:
        if node.type == "name":
            last = node.value
        elif node.type == "atom_expr" and not _is_call(node.children[-1]):
            tail = node.children[-1]
            last = tail.children[1].value if _is_attribute(tail) else ""
        else:
            return False
        return not self.FLAG.search(last)

    def _site(self, node: Any) -> str | None:
        if node.type == "not_test" and self._operand(node.children[1]):
            return f"len({_code(node.children[1])}) <= 1"
        if (
            self._operand(node)
            and node.parent is not None
            and node.parent.type in ("if_stmt", "while_stmt")
            and node.get_previous_sibling() in ("if", "elif", "while")
        ):
            return f"len({_code(node)}) > 1"
        if node.type == "comparison" and len(node.children) == 3:
            left, op, right = node.children
            shifted = self.SHIFT.get((_code(op), _code(right)))
            if shifted and self.SIZED.match(_code(left)):
                return f"{_code(left)} {shifted}"
        return None

    def mutation_positions(self, node: Any) -> Iterator[Position]:
        if self._site(node) is not None:
            yield (node.start_pos, node.end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        return _replacement(node, self._site(node) or _code(node))

    @classmethod
    def examples(cls) -> tuple[tuple[str, str], ...]:
        return (
            ("if not rows:\n    pass\n", "if len(rows) <= 1:\n    pass\n"),
            ("if rows:\n    pass\n", "if len(rows) > 1:\n    pass\n"),
            ("ok = h.shape[0] == 0\n", "ok = h.shape[0] <= 1\n"),
        )


class ReturnTheOther:
    """A ``return`` of the wrong one of two similar values: ``return x`` becomes ``return y`` where ``y`` is a
    name the same function returns elsewhere or a name sharing a word with ``x`` in that function (``path`` and
    ``resolved_path``, ``hidden`` and ``hidden_states``); ``return a if c else b`` becomes
    ``return b if c else a``."""

    fault = "a return of the wrong one of two similar values"

    @staticmethod
    def _words(name: str) -> set[str]:
        return {w for w in name.lower().split("_") if w}

    def _alternatives(self, node: Any) -> list[str]:
        if node.type != "return_stmt" or len(node.children) != 2:
            return []
        value = node.children[1]
        if value.type == "ternary" or (value.type == "test" and len(value.children) == 5):
            a, _, cond, _, b = value.children
            return [f"{_code(b)} if {_code(cond)} else {_code(a)}"]
        if value.type != "name":
            return []
        scope = node.parent
        while scope is not None and scope.type not in ("funcdef", "file_input"):
            scope = scope.parent
        if scope is None or scope.type != "funcdef":
            return []
        returned = [
            found.children[1].value
            for found in scope.iter_return_stmts()
            if len(found.children) == 2 and found.children[1].type == "name"
        ]
        names = [p.name.value for p in scope.get_params()]
        names += [leaf.value for leaf in _leaves(scope) if leaf.type == "name" and leaf.is_definition()]
        words = self._words(value.value)
        similar = [n for n in names if n != value.value and self._words(n) & words]
        out: list[str] = []
        for n in returned + similar:
            if n != value.value and n not in out:
                out.append(n)
        return out[:3]

    def mutation_positions(self, node: Any) -> Iterator[Position]:
        for _ in self._alternatives(node):
            yield (node.children[1].start_pos, node.children[1].end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        return _replacement(node, f"return {self._alternatives(node)[index]}")

    @classmethod
    def examples(cls) -> tuple[tuple[str, str], ...]:
        return (
            (
                "def f(path):\n    resolved_path = path.resolve()\n    return resolved_path\n",
                "def f(path):\n    resolved_path = path.resolve()\n    return path\n",
            ),
            ("def f(a, b, c):\n    return a if c else b\n", "def f(a, b, c):\n    return b if c else a\n"),
        )


#: a release as the code writes one: ``0.5.12``, ``0.5.12.post1``
_RELEASE = re.compile(r"(?<![\d.])(\d+)\.(\d+)\.(\d+)((?:\.post\d+)?)(?![\d.])")
#: a string that is a release or a specifier set of releases, and nothing else (not a message that names one)
_RELEASE_TEXT = re.compile(r"^(?:(?:[<>=!~]=?|==)?\s*\d+\.\d+\.\d+(?:\.post\d+)?\s*,?\s*)+$")


def _release_string(node: Any) -> tuple[str, str, str] | None:
    """``(prefix, body, quote)`` of a plain string leaf holding a release or a specifier set, else None."""
    if node.type != "string":
        return None
    m = re.match(r"^([rRbBuU]*)(['\"])(.*)\2$", node.value, re.S)
    if m is None or "f" in m.group(1).lower() or not _RELEASE_TEXT.match(m.group(3)):
        return None
    return m.group(1), m.group(3), m.group(2)


class ShiftReleaseBound:
    """A release in a range or a release constant moved by one patch release, down and up: ``">=0.5.12"`` becomes
    ``">=0.5.11"`` and ``">=0.5.13"``, ``Version("0.5.10")`` becomes ``Version("0.5.9")`` and ``Version("0.5.11")``
    (a ``.postN`` kept): the first or last release of a fix claimed one release off."""

    fault = "a release bound moved by one release"

    @staticmethod
    def _shifts(node: Any) -> list[str]:
        found = _release_string(node)
        if found is None:
            return []
        prefix, body, quote = found
        out = []
        for m in _RELEASE.finditer(body):
            major, minor, patch, post = m.group(1), m.group(2), int(m.group(3)), m.group(4)
            for moved in (patch - 1, patch + 1):
                if moved >= 0:
                    text = f"{body[: m.start()]}{major}.{minor}.{moved}{post}{body[m.end() :]}"
                    out.append(f"{prefix}{quote}{text}{quote}")
        return out

    def mutation_positions(self, node: Any) -> Iterator[Position]:
        for _ in self._shifts(node):
            yield (node.start_pos, node.end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        return _replacement(node, self._shifts(node)[index])

    @classmethod
    def examples(cls) -> tuple[tuple[str, str], ...]:
        return (
            ('applies_to = SpecifierSet(">=0.5.12")\n', 'applies_to = SpecifierSet(">=0.5.11")\n'),
            ('applies_to = SpecifierSet(">=0.5.12")\n', 'applies_to = SpecifierSet(">=0.5.13")\n', 1),
            ('FIXED_IN = "0.5.12.post1"\n', 'FIXED_IN = "0.5.11.post1"\n'),
        )


class CloseReleaseBound:
    """A release range's bound made inclusive or exclusive: ``"<0.5.16"`` becomes ``"<=0.5.16"``, ``">0.5.9"``
    ``">=0.5.9"``, and the reverse: the release the fix landed in counted on the wrong side."""

    fault = "an open bound of a release range closed (or a closed one opened)"
    FLIP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}
    OPERATOR = re.compile(r"(<=|>=|<|>)(?=\s*\d)")

    def _flips(self, node: Any) -> list[str]:
        found = _release_string(node)
        if found is None:
            return []
        prefix, body, quote = found
        return [
            f"{prefix}{quote}{body[: m.start()]}{self.FLIP[m.group(1)]}{body[m.end() :]}{quote}"
            for m in self.OPERATOR.finditer(body)
        ]

    def mutation_positions(self, node: Any) -> Iterator[Position]:
        for _ in self._flips(node):
            yield (node.start_pos, node.end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        return _replacement(node, self._flips(node)[index])

    @classmethod
    def examples(cls) -> tuple[tuple[str, str], ...]:
        return (
            ('applies_to = SpecifierSet(">=0.5.8,<0.5.16")\n', 'applies_to = SpecifierSet(">0.5.8,<0.5.16")\n'),
            ('applies_to = SpecifierSet(">=0.5.8,<0.5.16")\n', 'applies_to = SpecifierSet(">=0.5.8,<=0.5.16")\n', 1),
        )


class DropGuard:
    """A guard that leaves early removed: ``if <cond>: return ...`` / ``continue`` / ``break`` with no ``else``
    becomes ``pass``, so the code goes on with what was not ready yet (a row not written, a poll that came too early,
    a value not set)."""

    fault = 'a guard on "not ready yet" removed'
    EXITS = ("return_stmt", "continue_stmt", "break_stmt")

    def _is_guard(self, node: Any) -> bool:
        if node.type != "if_stmt" or len(node.children) != 4:  # if, test, :, body (no elif / else)
            return False
        body = node.children[3]
        stmts = [c for c in body.children if c.type != "newline"] if body.type == "suite" else [body]
        if len(stmts) != 1 or stmts[0].type != "simple_stmt":
            return False
        first = stmts[0].children[0]
        return first.type in self.EXITS or (first.type == "keyword" and first.value in ("continue", "break", "return"))

    def mutation_positions(self, node: Any) -> Iterator[Position]:
        if self._is_guard(node):
            yield (node.start_pos, node.end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        return _replacement(node, "pass\n")

    @classmethod
    def examples(cls) -> tuple[tuple[str, str], ...]:
        return (
            (
                "def f(row):\n    if row is None:\n        return None\n    return row.value\n",
                "def f(row):\n    pass\n    return row.value\n",
            ),
        )


class WidenGroup:
    """A process group's getter widened: ``get_attention_tp_group`` (``get_attn_tp_group``) becomes
    ``get_tp_group`` everywhere in the module (its import and its calls alike, as a maintainer's rename would
    make it), so a collective runs over the whole TP group instead of the attention-TP group."""

    fault = "a group name swapped for the wider group's"
    NAME = re.compile(r"^get_(?:[a-z0-9]+_)+([a-z0-9]+)_group$")

    def _names(self, node: Any) -> list[str]:
        if node.type != "file_input":
            return []
        seen: list[str] = []
        for leaf in _all_leaves(node):
            if leaf.type == "name" and self.NAME.match(leaf.value) and leaf.value not in seen:
                seen.append(leaf.value)
        return seen

    def _first(self, node: Any, name: str) -> Any:
        return next(leaf for leaf in _all_leaves(node) if leaf.type == "name" and leaf.value == name)

    def mutation_positions(self, node: Any) -> Iterator[Position]:
        for name in self._names(node):
            leaf = self._first(node, name)
            yield (leaf.start_pos, leaf.end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        name = self._names(node)[index]
        wide = self.NAME.sub(r"get_\1_group", name)
        code = "".join(
            (leaf.prefix + wide) if leaf.type == "name" and leaf.value == name else leaf.get_code()
            for leaf in _all_leaves(node)
        )
        return parso.parse(code)

    @classmethod
    def examples(cls) -> tuple[tuple[str, str], ...]:
        return (
            (
                "from d import get_attention_tp_group\nget_attention_tp_group().all_gather(x)\n",
                "from d import get_tp_group\nget_tp_group().all_gather(x)\n",
            ),
        )


class RespellName:
    """A name in a module table (a literal collection assigned to a ``CONSTANT``) spelt the other way:
    ``"cutlass_mla"`` becomes ``"cutlass-mla"`` (as a command line spells a flag) and ``"two-batch"``
    ``"two_batch"``: the table no longer matches what sglang compares it with."""

    fault = "a backend or setting name spelt the other way (_ and -)"
    SNAKE = re.compile(r"^[a-z0-9]+(?:_[a-z0-9]+)+$")
    KEBAB = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)+$")

    def _respelt(self, node: Any) -> str | None:
        if node.type != "string" or not self._in_table(node):
            return None
        m = re.match(r"^(['\"])(.*)\1$", node.value, re.S)
        if m is None:
            return None
        body = m.group(2)
        if self.SNAKE.match(body):
            return f"{m.group(1)}{body.replace('_', '-')}{m.group(1)}"
        if self.KEBAB.match(body):
            return f"{m.group(1)}{body.replace('-', '_')}{m.group(1)}"
        return None

    @staticmethod
    def _in_table(node: Any) -> bool:
        parent = node.parent
        if parent is None or parent.type not in ("testlist_comp", "dictorsetmaker", "atom"):
            return False
        scope = parent.parent
        while scope is not None and scope.type not in ("expr_stmt", "annassign", "file_input", "funcdef", "classdef"):
            scope = scope.parent
        if scope is None or scope.type not in ("expr_stmt", "annassign"):
            return False
        target = scope.children[0] if scope.type == "expr_stmt" else scope.parent.children[0]
        return target.type == "name" and bool(DropLiteralElement.CONSTANT.match(target.value))

    def mutation_positions(self, node: Any) -> Iterator[Position]:
        if self._respelt(node) is not None:
            yield (node.start_pos, node.end_pos)

    def mutate(self, node: Any, index: int) -> Any:
        return _replacement(node, self._respelt(node) or node.value)

    @classmethod
    def examples(cls) -> tuple[tuple[str, str], ...]:
        return (('BACKENDS = ("fa3", "cutlass_mla")\n', 'BACKENDS = ("fa3", "cutlass-mla")\n'),)


def _all_leaves(node: Any) -> Iterator[Any]:
    """Every leaf under ``node``, in order."""
    for child in node.children:
        if isinstance(child, tree.BaseNode):
            yield from _all_leaves(child)
        else:
            yield child


def _leaves(node: Any) -> Iterator[Any]:
    """The leaves under ``node``, not descending into nested functions or classes."""
    for child in node.children:
        if isinstance(child, tree.BaseNode):
            if child.type in ("funcdef", "classdef"):
                continue
            yield from _leaves(child)
        else:
            yield child


#: the operators, by the name a session records
OPERATORS: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        DeleteCallStatement,
        DropLiteralElement,
        DropNormalisation,
        DropPathSeparator,
        SwapAnyAll,
        IgnoreArgument,
        ShiftEmptinessBoundary,
        ReturnTheOther,
        ShiftReleaseBound,
        CloseReleaseBound,
        DropGuard,
        WidenGroup,
        RespellName,
    )
}


def mutate_code(source: str, operator: Any, occurrence: int) -> str | None:
    """``source`` with the ``occurrence``-th mutation of ``operator`` made, or None if it has fewer: cosmic-ray's
    ``MutationVisitor`` walk (pre-order; the mutated node replaces the visited one), so a test sees the mutant a
    session would run."""
    count = 0
    applied = False

    def walk(node: Any) -> Any:
        nonlocal count, applied
        for index, _ in enumerate(operator.mutation_positions(node)):
            if count == occurrence:
                applied = True
                node = operator.mutate(node, index)
            count += 1
        if isinstance(node, tree.BaseNode):
            node.children = [walk(child) for child in node.children]
        return node

    module = walk(parso.parse(source))
    return module.get_code() if applied else None


def mutants(source: str, operator: Any) -> list[str]:
    """Every mutant ``operator`` makes of ``source``, in occurrence order."""
    out = []
    while (mutated := mutate_code(source, operator, len(out))) is not None:
        out.append(mutated)
    return out
