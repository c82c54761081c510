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
    """One element dropped from a literal tuple / list / set whose elements are all strings or numbers (the hooks a
    wrapper delegates, the algorithms a guard covers, the forward modes it checks)."""

    fault = "a case forgotten from a list of names"

    @staticmethod
    def _elements(node: Any) -> list[Any] | None:
        if node.type != "atom" or len(node.children) != 3 or node.children[0].type != "operator":
            return None
        inner = node.children[1]
        if inner.type not in ("testlist_comp", "dictorsetmaker"):
            return None
        items = [c for c in inner.children if not (c.type == "operator" and c.value == ",")]
        if len(items) < 2 or any(c.type not in ("string", "number") for c in items):
            return None
        return items

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
