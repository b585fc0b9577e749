"""TLC's printed values and error traces, as Python values.

TLC (tla2tools 2.15 here) prints a behaviour as states of ``/\\ var = value``
lines, each state headed by ``State N: <Action line L, col C to line L2,
col C2 of module M>`` (``<Initial predicate>`` for the first).  This module
parses those values:

=========================  ==============================================
TLC                        Python
=========================  ==============================================
``3``, ``-1``              int
``"OPEN"``                 str
``TRUE`` / ``FALSE``       bool
``b1`` (a model value)     ``ModelValue`` (a ``str``: equal to ``"b1"``)
``{a, b}``                 frozenset
``<<a, b>>``               tuple
``[f |-> 1, g |-> 2]``     ``Record`` (a hashable dict)
``(k1 :> v1 @@ k2 :> v2)`` ``Func`` (a hashable dict)
=========================  ==============================================

and splits TLC's output into behaviours (``behaviours``): one per
``Error: Invariant X is violated.`` (with ``-continue``, TLC prints one
for each behaviour that violates it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


class ModelValue(str):
    """A TLC model value (e.g. a bookie ``b1``): a str, told apart by type."""

    def __repr__(self) -> str:
        return f"ModelValue({str(self)!r})"


class _FrozenDict(dict):
    def __hash__(self) -> int:  # (values in sets; never mutated after parsing)
        return hash(frozenset(self.items()))

    def _ro(self, *a, **k):
        raise TypeError(f"{type(self).__name__} is immutable")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = _ro


class Record(_FrozenDict):
    """``[f |-> v, ...]``"""


class Func(_FrozenDict):
    """``(k :> v @@ ...)``"""


_TOKEN = re.compile(r'\s*(<<|>>|\|->|:>|@@|[{}\[\](),]|"(?:[^"\\]|\\.)*"|-?\d+|[A-Za-z_][A-Za-z0-9_]*)')


class ParseError(ValueError):
    pass


def _tokens(text: str) -> list[str]:
    out, i, text = [], 0, text.rstrip()
    while i < len(text):
        m = _TOKEN.match(text, i)
        if not m:
            raise ParseError(f"unexpected {text[i:i + 20]!r} at {i}")
        out.append(m.group(1))
        i = m.end()
    return out


class _Parser:
    def __init__(self, text: str):
        self.t, self.i = _tokens(text), 0

    def peek(self) -> str | None:
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise ParseError(f"expected {want or 'a value'}, got {tok!r} (token {self.i})")
        self.i += 1
        return tok

    def items(self, close: str, item) -> list:
        out = []
        if self.peek() == close:
            self.take(close)
            return out
        while True:
            out.append(item())
            if self.take() == close:
                return out
            if self.t[self.i - 1] != ",":
                raise ParseError(f"expected ',' or {close!r}, got {self.t[self.i - 1]!r}")

    def value(self):
        tok = self.take()
        if tok == "<<":
            return tuple(self.items(">>", self.value))
        if tok == "{":
            return frozenset(self.items("}", self.value))
        if tok == "[":
            def field():
                name = self.take()
                self.take("|->")
                return name, self.value()
            return Record(self.items("]", field))
        if tok == "(":
            pairs = []
            while True:
                k = self.value()
                self.take(":>")
                pairs.append((k, self.value()))
                nxt = self.take()
                if nxt == ")":
                    return Func(pairs)
                if nxt != "@@":
                    raise ParseError(f"expected '@@' or ')', got {nxt!r}")
        if tok.startswith('"'):
            return re.sub(r'\\(.)', r'\1', tok[1:-1])
        if tok in ("TRUE", "FALSE"):
            return tok == "TRUE"
        if re.fullmatch(r"-?\d+", tok):
            return int(tok)
        if re.fullmatch(r"[A-Za-z_]\w*", tok):
            return ModelValue(tok)
        raise ParseError(f"unexpected {tok!r}")


def parse_value(text: str):
    """One TLC value (the text after ``var = ``)."""
    p = _Parser(text)
    v = p.value()
    if p.peek() is not None:
        raise ParseError(f"trailing {p.t[p.i:p.i + 5]}")
    return v


@dataclass(frozen=True)
class State:
    number: int
    action: str                 # the action's name ("Init" for the initial state)
    location: str               # TLC's text in <...>: "line L, col C to ... of module M"
    vars: dict


_HEAD = re.compile(r"^State (\d+): <(?:(Initial predicate)|(\w+)(?: (line .*))?)>\s*$")


def parse_state_body(lines: list[str]) -> dict:
    """``/\\ var = value`` lines (a value may span lines) as {var: value}."""
    out, cur = {}, None
    for line in lines:
        if line.startswith("/\\ "):
            name, _, rest = line[3:].partition(" = ")
            cur = [name.strip(), [rest]]
            out[cur[0]] = cur[1]
        elif cur is not None:
            cur[1].append(line)
    return {k: parse_value(" ".join(v)) for k, v in out.items()}


def behaviours(output: str, invariant: str) -> list[list[State]]:
    """Every error trace TLC printed for ``invariant`` (the last one too if
    it is complete: followed by a blank line)."""
    marker = f"Error: Invariant {invariant} is violated."
    chunks = output.split(marker)[1:]
    out = []
    for chunk in chunks:
        lines = chunk.splitlines()
        states, k = [], 0
        while k < len(lines):
            m = _HEAD.match(lines[k])
            if not m:
                k += 1
                continue
            body, k = [], k + 1
            while k < len(lines) and lines[k].strip():
                body.append(lines[k])
                k += 1
            if k >= len(lines):  # cut off (the process was stopped while printing)
                break
            action = "Init" if m.group(2) else m.group(3)
            states.append(State(int(m.group(1)), action, m.group(4) or "", parse_state_body(body)))
        if states:
            out.append(states)
    return out


__all__ = ["ModelValue", "Record", "Func", "ParseError", "parse_value", "State", "behaviours",
           "parse_state_body"]
