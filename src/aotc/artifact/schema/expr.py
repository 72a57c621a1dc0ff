"""Size expressions: the small grammar that shapes, grids and guard relations are written in.

Plans and manifests carry symbolic sizes as text ("2*seq", "(batch + 3) // 4",
"min(seq, 128)") and guard relations as boolean text ("seq % 8 == 0"). The text is parsed here
by a hand-written recursive-descent parser into frozen nodes, never by Python's parser:

    relation := disj
    disj     := conj ('or' conj)*
    conj     := neg ('and' neg)*
    neg      := 'not' neg | comparison
    comparison := sum (('==' | '!=' | '<' | '<=' | '>' | '>=') sum)?
    sum      := product (('+' | '-') product)*
    product  := unary (('*' | '//' | '%') unary)*
    unary    := '-' unary | atom
    atom     := INTEGER | NAME | ('min' | 'max') '(' sum (',' sum)+ ')' | '(' relation ')'

Names are ASCII identifiers and must be declared symbols; integers fit in 63 bits; the text, the
number of nodes and the nesting depth are bounded. What the runtime runs is printed back from the
nodes (`source`), so no artifact text ever reaches Python's compiler: only integers, `S_<name>`
locals, operators and min/max appear. `bounds` gives sound interval bounds over declared symbol
ranges (the loader refuses a buffer whose size could exceed its limit).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

MAX_TEXT = 4096          # characters in one expression
MAX_NODES = 512          # nodes in one expression
MAX_DEPTH = 48           # nesting depth
MAX_INT = 2**63 - 1      # largest integer literal
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
# ASCII only: digits 0-9 and blanks " \t\n\r\f\v" (the C++ front end's grammar, expr_check.cpp,
# reads the same tokens)
BLANKS = " \t\n\r\f\v"
_TOKEN = re.compile(r"[ \t\n\r\f\v]*"
                    r"(?:([0-9]+)|([A-Za-z_][A-Za-z0-9_]*)|(//|==|!=|<=|>=|[-+*%<>(),]))")
KEYWORDS = frozenset({"and", "or", "not", "min", "max"})
ARITH = ("+", "-", "*", "//", "%")
COMPARE = ("==", "!=", "<", "<=", ">", ">=")


class ExprError(ValueError):
    """Text that is not an expression of the grammar (the caller says which field held it)."""


@dataclass(frozen=True, slots=True)
class Const:
    value: int


@dataclass(frozen=True, slots=True)
class Sym:
    name: str


@dataclass(frozen=True, slots=True)
class Neg:
    arg: "Node"


@dataclass(frozen=True, slots=True)
class Bin:
    op: str            # one of ARITH or COMPARE, or "and" / "or"
    left: "Node"
    right: "Node"


@dataclass(frozen=True, slots=True)
class Call:
    fn: str            # "min" | "max"
    args: tuple


@dataclass(frozen=True, slots=True)
class Not:
    arg: "Node"


Node = Const | Sym | Neg | Bin | Call | Not


class _Parser:
    def __init__(self, text: str, symbols):
        if not isinstance(text, str) or len(text) > MAX_TEXT:
            raise ExprError(f"expected an expression of at most {MAX_TEXT} characters")
        self.tokens, self.symbols, self.pos, self.nodes = _tokens(text), symbols, 0, 0

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, want=None):
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise ExprError(f"expected {want or 'more'} at token {self.pos}, found {tok!r}")
        self.pos += 1
        return tok

    def node(self, n, depth):
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            raise ExprError(f"expression larger than {MAX_NODES} nodes or deeper than "
                            f"{MAX_DEPTH}")
        return n

    def chain(self, ops, sub, depth):
        left = sub(depth + 1)
        while self.peek() in ops:
            op = self.take()
            left = self.node(Bin(op, left, sub(depth + 1)), depth)
        return left

    def disj(self, d=0):
        return self.chain(("or",), self.conj, d)

    def conj(self, d=0):
        return self.chain(("and",), self.neg, d)

    def neg(self, d=0):
        if self.peek() == "not":
            self.take()
            return self.node(Not(self.neg(d + 1)), d)
        left = self.sum(d + 1)
        if self.peek() in COMPARE:
            op = self.take()
            left = self.node(Bin(op, left, self.sum(d + 1)), d)
        return left

    def sum(self, d=0):
        return self.chain(("+", "-"), self.product, d)

    def product(self, d=0):
        return self.chain(("*", "//", "%"), self.unary, d)

    def unary(self, d=0):
        if self.peek() == "-":
            self.take()
            return self.node(Neg(self.unary(d + 1)), d)
        return self.atom(d + 1)

    def atom(self, d):
        tok = self.take()
        if isinstance(tok, int):
            return self.node(Const(tok), d)
        if tok == "(":
            inner = self.disj(d + 1)
            self.take(")")
            return inner
        if tok in ("min", "max"):
            self.take("(")
            args = [self.sum(d + 1)]
            while self.peek() == ",":
                self.take()
                args.append(self.sum(d + 1))
            self.take(")")
            if len(args) < 2:
                raise ExprError(f"{tok}() needs at least two arguments")
            return self.node(Call(tok, tuple(args)), d)
        if isinstance(tok, str) and NAME_RE.match(tok) and tok not in KEYWORDS:
            if self.symbols is not None and tok not in self.symbols:
                raise ExprError(f"{tok!r} is not a declared size symbol "
                                f"(declared: {sorted(self.symbols)})")
            return self.node(Sym(tok), d)
        raise ExprError(f"unexpected token {tok!r}")


def _tokens(text: str) -> list:
    out, pos = [], 0
    text = text.rstrip(BLANKS)
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ExprError(f"unexpected character {text[pos:pos + 1]!r} at {pos}")
        number, name, op = m.groups()
        if number is not None:
            value = int(number) if len(number) <= 19 else MAX_INT + 1
            if value > MAX_INT:
                raise ExprError(f"integer {number[:24]} does not fit in 63 bits")
            out.append(value)
        else:
            out.append(name if name is not None else op)
        pos = m.end()
    return out


def _parse(text: str, symbols, boolean: bool) -> Node:
    p = _Parser(text, symbols)
    node = p.disj() if boolean else p.sum()
    if p.peek() is not None:
        raise ExprError(f"unexpected {p.peek()!r} after the expression")
    if is_boolean(node) != boolean:
        raise ExprError("expected a comparison" if boolean else "expected an integer "
                        "expression, found a comparison")
    return node


def parse_size(text: str, symbols=None) -> Node:
    """An integer expression over `symbols` (None: any identifier-shaped name)."""
    return _parse(text, symbols, boolean=False)


def parse_relation(text: str, symbols=None) -> Node:
    """A boolean expression: comparisons of integer expressions joined by and/or/not."""
    return _parse(text, symbols, boolean=True)


def is_boolean(n: Node) -> bool:
    return isinstance(n, Not) or (isinstance(n, Bin) and n.op not in ARITH)


def names(n: Node) -> set[str]:
    if isinstance(n, Sym):
        return {n.name}
    if isinstance(n, Const):
        return set()
    if isinstance(n, (Neg, Not)):
        return names(n.arg)
    if isinstance(n, Bin):
        return names(n.left) | names(n.right)
    return set().union(*(names(a) for a in n.args))


def source(n: Node, prefix: str = "S_") -> str:
    """Python source of a node, each symbol `name` read from the local `<prefix><name>`."""
    if isinstance(n, Const):
        return str(n.value)
    if isinstance(n, Sym):
        return f"{prefix}{n.name}"
    if isinstance(n, Neg):
        return f"(-{source(n.arg, prefix)})"
    if isinstance(n, Not):
        return f"(not {source(n.arg, prefix)})"
    if isinstance(n, Bin):
        return f"({source(n.left, prefix)} {n.op} {source(n.right, prefix)})"
    return f"{n.fn}({', '.join(source(a, prefix) for a in n.args)})"


def text(n: Node) -> str:
    """The node printed back in the grammar (symbols by their own names)."""
    return source(n, prefix="")


def evaluate(n: Node, env: dict[str, int]):
    """The node's value with symbols bound by `env` (ZeroDivisionError on // or % by 0)."""
    if isinstance(n, Const):
        return n.value
    if isinstance(n, Sym):
        return env[n.name]
    if isinstance(n, Neg):
        return -evaluate(n.arg, env)
    if isinstance(n, Not):
        return not evaluate(n.arg, env)
    if isinstance(n, Call):
        return (min if n.fn == "min" else max)(evaluate(a, env) for a in n.args)
    a = evaluate(n.left, env)
    if n.op == "and":
        return a and evaluate(n.right, env)
    if n.op == "or":
        return a or evaluate(n.right, env)
    return _BINARY[n.op](a, evaluate(n.right, env))


_BINARY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
           "//": lambda a, b: a // b, "%": lambda a, b: a % b,
           "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
           "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def bounds(n: Node, ranges: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """Sound interval bounds (lo, hi) of an integer node when each symbol lies in its range."""
    if isinstance(n, Const):
        return n.value, n.value
    if isinstance(n, Sym):
        return ranges[n.name]
    if isinstance(n, Neg):
        lo, hi = bounds(n.arg, ranges)
        return -hi, -lo
    if isinstance(n, Call):
        parts = [bounds(a, ranges) for a in n.args]
        pick = min if n.fn == "min" else max
        return pick(p[0] for p in parts), pick(p[1] for p in parts)
    (a, b), (c, d) = bounds(n.left, ranges), bounds(n.right, ranges)
    if n.op == "+":
        return a + c, b + d
    if n.op == "-":
        return a - d, b - c
    if n.op == "*":
        products = (a * c, a * d, b * c, b * d)
        return min(products), max(products)
    if n.op == "//" and c > 0:
        return a // d if a >= 0 else a // c, b // c if b >= 0 else b // d
    if n.op == "%" and c > 0:
        return (a, b) if 0 <= a and b < c else (0, d - 1)
    wide = max(abs(a), abs(b), abs(c), abs(d))
    return -wide, wide
