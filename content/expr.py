"""A safe evaluator for the `compute` expressions of concept entries.

An expression is parsed with `ast` and walked by hand; only arithmetic on declared variable names is
allowed: numbers, + - * / // % **, unary + and -, parentheses, and the functions in FUNCTIONS. Nothing in
content is ever passed to eval or exec.
"""

from __future__ import annotations

import ast
import collections
import math
import operator
from collections.abc import Callable, Mapping

MAX_LENGTH = 500  # characters; real formulas are one line
MAX_NODES = 200
MAX_EXPONENT = 64  # so 9**9**9 is refused instead of hanging
MAX_MAGNITUDE = 1e300  # any larger intermediate is refused (it would overflow a float anyway)

Number = int | float


class ExpressionError(ValueError):
    """An expression that is not allowed or cannot be evaluated; the message says what was expected."""


def _log2(x: Number) -> float:
    if x <= 0:
        raise ExpressionError(f"log2: expected a positive argument, got {_show(x)}")
    return math.log2(x)


def _sqrt(x: Number) -> float:
    if x < 0:
        raise ExpressionError(f"sqrt: expected a non-negative argument, got {_show(x)}")
    return math.sqrt(x)


# name -> (function, number of arguments: exact int, or None for "two or more")
FUNCTIONS: dict[str, tuple[Callable[..., Number], int | None]] = {
    "min": (min, None),
    "max": (max, None),
    "ceil": (math.ceil, 1),
    "floor": (math.floor, 1),
    "log2": (_log2, 1),
    "sqrt": (_sqrt, 1),
}

_BINARY: dict[type, tuple[str, Callable[[Number, Number], Number]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
    ast.FloorDiv: ("//", operator.floordiv),
    ast.Mod: ("%", operator.mod),
    ast.Pow: ("**", operator.pow),
}
_UNARY: dict[type, Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_ALLOWED = "numbers, declared variable names, + - * / // % **, parentheses and " + ", ".join(FUNCTIONS)


def _show(x: Number) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _describe(node: ast.AST) -> str:
    """A short name for a construct that is not allowed."""
    if isinstance(node, ast.Attribute):
        return f"attribute access '.{node.attr}'"
    if isinstance(node, ast.Call):
        return "a call to something that is not a plain function name"
    if isinstance(node, ast.Constant):
        return f"the constant {node.value!r}"
    if isinstance(node, ast.Subscript):
        return "indexing [...]"
    if isinstance(node, ast.Compare | ast.BoolOp):
        return "a comparison or boolean operator"
    if isinstance(node, ast.BinOp):
        return f"the operator {type(node.op).__name__}"
    if isinstance(node, ast.Lambda):
        return "a lambda"
    return type(node).__name__


def parse(expression: str, variables: set[str] | frozenset[str]) -> ast.Expression:
    """Parse and vet an expression: every construct allowed, every name declared. Raises ExpressionError."""
    if not isinstance(expression, str):
        raise ExpressionError(f"expected an arithmetic expression as text, got {type(expression).__name__}")
    if len(expression) > MAX_LENGTH:
        raise ExpressionError(f"expected at most {MAX_LENGTH} characters, got {len(expression)}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ExpressionError(f"expected an arithmetic expression, got a syntax error at column "
                              f"{err.offset}: {expression.strip()!r}") from None
    except (RecursionError, MemoryError):
        raise ExpressionError("expected an arithmetic expression, got one nested too deeply") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise ExpressionError(f"expected at most {MAX_NODES} syntax nodes, got {len(nodes)}")
    for node in nodes:
        _vet(node, variables, expression.strip())
    _evaluate_constant_parts(tree)
    return tree


def _evaluate_constant_parts(tree: ast.Expression) -> None:
    """Evaluate every operation that reads no variable now, so 9**9**9 fails when the expression is read and not
    when a value is given. Each largest such part is evaluated once (its inner parts with it), in breadth-first
    order: the first error is the one an evaluation of every constant operation in ast.walk's order meets."""
    reads: dict[int, bool] = {}  # id(node) -> whether its value depends on a variable

    def mark(node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            found = True
        else:  # a call's callee is a function name, not a variable
            found = False
            for child in (node.args if isinstance(node, ast.Call) else ast.iter_child_nodes(node)):
                found = mark(child) or found
        reads[id(node)] = found
        return found

    mark(tree)
    queue = collections.deque([tree])
    while queue:
        node = queue.popleft()
        if isinstance(node, ast.BinOp | ast.UnaryOp | ast.Call) and not reads[id(node)]:
            _eval(node, {})
        else:
            queue.extend(ast.iter_child_nodes(node))


def _vet(node: ast.AST, variables: set[str] | frozenset[str], source: str) -> None:
    if isinstance(node, ast.Expression | ast.Load) or type(node) in _BINARY or type(node) in _UNARY:
        return
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ExpressionError(f"expected only {_ALLOWED}; got {_describe(node)}")
        return
    if isinstance(node, ast.Name):
        if node.id in variables:
            return
        if node.id in FUNCTIONS:  # checked as the callee of its Call node
            return
        declared = ", ".join(sorted(variables)) or "none"
        raise ExpressionError(f"expected only declared variables ({declared}); got undeclared name '{node.id}'")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            callee = ast.get_source_segment(source, node.func) or _describe(node.func)
            raise ExpressionError(f"expected only {_ALLOWED}; got a call to {callee!r}")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise ExpressionError(f"{node.func.id}: expected plain positional arguments")
        arity = FUNCTIONS[node.func.id][1]
        if (arity is None and len(node.args) < 2) or (arity is not None and len(node.args) != arity):
            want = "two or more" if arity is None else str(arity)
            raise ExpressionError(f"{node.func.id}: expected {want} argument(s), got {len(node.args)}")
        return
    raise ExpressionError(f"expected only {_ALLOWED}; got {_describe(node)}")


def free_names(tree: ast.Expression) -> set[str]:
    """Variable names the expression reads (function names excluded)."""
    known = getattr(tree, "_dantinox_free_names", None)  # a parsed tree is evaluated many times (content/ranges.py)
    if known is None:
        callees = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        known = frozenset(n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in callees)
        tree._dantinox_free_names = known
    return set(known)


def evaluate(expression: str | ast.Expression, values: Mapping[str, Number]) -> Number:
    """Evaluate a vetted expression with the given variable values. Raises ExpressionError."""
    tree = expression if isinstance(expression, ast.Expression) else parse(expression, frozenset(values))
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ExpressionError(f"{name}: expected a finite number, got {value!r}")
    missing = sorted(free_names(tree) - set(values))
    if missing:
        raise ExpressionError(f"expected a value for {', '.join(missing)}, got none")
    return _eval(tree.body, values)


def _checked(x: Number) -> Number:
    if (isinstance(x, float) and not math.isfinite(x)) or abs(x) > MAX_MAGNITUDE:
        raise ExpressionError(f"expected a result smaller than {MAX_MAGNITUDE:g} in magnitude")
    return x


def _eval(node: ast.AST, values: Mapping[str, Number]) -> Number:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](_eval(node.operand, values))
    if isinstance(node, ast.BinOp):
        symbol, fn = _BINARY[type(node.op)]
        left, right = _eval(node.left, values), _eval(node.right, values)
        if symbol in ("/", "//", "%") and right == 0:
            raise ExpressionError(f"expected a non-zero divisor for '{symbol}', got 0")
        if symbol == "**":
            if abs(right) > MAX_EXPONENT:
                raise ExpressionError(f"expected an exponent of at most {MAX_EXPONENT}, got {_show(right)}")
            if left == 0 and right < 0:
                raise ExpressionError("expected a non-zero base for a negative exponent, got 0")
            if left < 0 and not float(right).is_integer():
                raise ExpressionError("expected a non-negative base for a fractional exponent")
        try:
            return _checked(fn(left, right))
        except OverflowError:
            raise ExpressionError(f"expected a result smaller than {MAX_MAGNITUDE:g} in magnitude") from None
    if isinstance(node, ast.Call):
        fn = FUNCTIONS[node.func.id][0]
        return _checked(fn(*(_eval(a, values) for a in node.args)))
    raise ExpressionError(f"expected only {_ALLOWED}; got {_describe(node)}")  # unreachable after parse
