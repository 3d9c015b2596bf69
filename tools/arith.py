"""A safe arithmetic subset of Python (``safe_exec``) and the ``python`` tool built on it."""

from __future__ import annotations

import ast
import math
import operator
import threading
from collections.abc import Callable
from typing import Any

from agentloop.errors import ToolError
from agentloop.tools.tool import tool

__all__ = ["python", "safe_exec"]

MAX_CODE_CHARS = 10_000
# CPython 3.11 keeps ast.parse's recursion bookkeeping per interpreter: two threads parsing at once
# can fail with "AST constructor recursion depth mismatch". Our parses take turns.
_PARSE_LOCK = threading.Lock()
MAX_INT_BITS = 10_000  # ~3000 digits: far beyond any arithmetic task, well below int→str limits

Number = int | float

ALLOWED = (
    "int/float literals, + - * / // % ** (and unary -/+), parentheses, assignments to names "
    "(x = ..., x += ...), print(...), abs/round/min/max/int/float, and a final expression whose "
    "value is shown"
)

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "int": int,
    "float": float,
}


class _Reject(Exception):
    """Code outside the allowed subset, or an arithmetic error; carries the AST node."""

    def __init__(self, node: ast.AST | None, message: str, *, outside_subset: bool = False) -> None:
        super().__init__(message)
        self.line = getattr(node, "lineno", None)
        self.outside_subset = outside_subset


def _check_size(value: Any, node: ast.AST) -> Number:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Reject(node, f"the result is a {type(value).__name__}, not a number")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise _Reject(node, f"result too large (more than {MAX_INT_BITS} bits)")
    if isinstance(value, float) and not math.isfinite(value):
        raise _Reject(node, f"result is {value} (overflow)")
    return value


def _pow(base: Number, exp: Number, node: ast.AST) -> Number:
    # Guard before computing: 10 ** 10 ** 9 would run for minutes.
    int_args = isinstance(base, int) and isinstance(exp, int)
    if int_args and exp > 0 and abs(base) > 1 and exp * math.log2(abs(base)) > MAX_INT_BITS:
        raise _Reject(node, f"result too large: {base} ** {exp} has more than {MAX_INT_BITS} bits")
    result = base**exp
    if isinstance(result, complex):
        raise _Reject(node, "a negative number to a fractional power is complex, not supported")
    return result


class _Evaluator:
    def __init__(self) -> None:
        self.names: dict[str, Number] = {}
        self.output: list[str] = []

    def expr(self, node: ast.expr) -> Number:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float):
                raise _Reject(
                    node,
                    f"the literal {node.value!r} is not allowed (numbers only)",
                    outside_subset=True,
                )
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in self.names:
                raise _Reject(node, f"name {node.id!r} is not defined")
            return self.names[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = self.expr(node.operand)
            return -value if isinstance(node.op, ast.USub) else +value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = self.expr(node.left), self.expr(node.right)
            if isinstance(node.op, ast.Pow):
                return _check_size(_pow(left, right, node), node)
            return _check_size(_BINOPS[type(node.op)](left, right), node)
        if isinstance(node, ast.Call):
            return _check_size(self.call(node), node)
        raise _Reject(node, f"{_describe(node)} is not allowed", outside_subset=True)

    def call(self, node: ast.Call) -> Any:
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in _FUNCTIONS:
            raise _Reject(
                node, f"calling {ast.unparse(node.func)!r} is not allowed", outside_subset=True
            )
        if node.keywords:
            raise _Reject(node, f"keyword arguments to {name}() are not allowed")
        args = [self.expr(a) for a in node.args]
        if name == "round" and len(args) == 2 and abs(args[1]) > 100:
            # round(5, -10**9) would compute 10 ** 10**9 first.
            raise _Reject(node, "round() digits must be between -100 and 100")
        return _FUNCTIONS[name](*args)

    def stmt(self, node: ast.stmt, last: bool) -> None:
        if isinstance(node, ast.Assign):
            if not all(isinstance(t, ast.Name) for t in node.targets):
                raise _Reject(
                    node,
                    "only assignments to simple names (x = ...) are allowed",
                    outside_subset=True,
                )
            value = self.expr(node.value)
            for target in node.targets:
                self.names[target.id] = value  # type: ignore[attr-defined]
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            binop = ast.BinOp(left=ast.Name(node.target.id), op=node.op, right=node.value)
            self.names[node.target.id] = self.expr(ast.copy_location(binop, node))
        elif isinstance(node, ast.Expr) and _is_print(node.value):
            call = node.value
            assert isinstance(call, ast.Call)
            if call.keywords:
                raise _Reject(node, "keyword arguments to print() are not allowed")
            self.output.append(" ".join(str(self.expr(a)) for a in call.args))
        elif isinstance(node, ast.Expr):
            value = self.expr(node.value)
            if last:
                self.output.append(repr(value))
        else:
            raise _Reject(node, f"{_describe(node)} is not allowed", outside_subset=True)


def _is_print(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
    )


def _describe(node: ast.AST) -> str:
    kind = type(node).__name__
    try:
        snippet = ast.unparse(node)
    except Exception:
        return kind
    snippet = snippet if len(snippet) <= 40 else snippet[:37] + "..."
    return f"{kind} ({snippet!r})"


def safe_exec(code: str) -> str:
    """Evaluate arithmetic-only Python and return what it printed (plus the value of a final
    bare expression, like a REPL). Raises ``ToolError`` saying what is not allowed or what went
    wrong, with its line number.

    Allowed: int/float literals, ``+ - * / // % **`` (powers are size-guarded), unary ``-``/``+``,
    parentheses, assignments to simple names (``x = ...``, ``x += ...``), ``print(...)``,
    ``abs/round/min/max/int/float``. Everything else (strings, imports, attributes, loops, …) is
    rejected before anything runs or at the statement that uses it.
    """
    if len(code) > MAX_CODE_CHARS:
        raise ToolError(f"code is {len(code)} characters; the limit is {MAX_CODE_CHARS}")
    try:
        with _PARSE_LOCK:
            tree = ast.parse(code, mode="exec")
    except SyntaxError as e:
        raise ToolError(f"syntax error at line {e.lineno}: {e.msg}") from None
    except (RecursionError, MemoryError):
        raise ToolError("the code is nested too deeply to parse; split it into steps") from None
    except ValueError as e:  # e.g. a null byte in the source
        raise ToolError(f"cannot parse the code: {e}") from None
    ev = _Evaluator()
    for i, node in enumerate(tree.body):
        try:
            ev.stmt(node, last=i == len(tree.body) - 1)
        except _Reject as e:
            allowed = f". Allowed: {ALLOWED}" if e.outside_subset else ""
            raise ToolError(f"line {e.line or node.lineno}: {e}{allowed}") from None
        except (ArithmeticError, ValueError, TypeError) as e:
            raise ToolError(f"line {node.lineno}: {type(e).__name__}: {e}") from None
        except RecursionError:
            raise ToolError(
                f"line {node.lineno}: the expression is nested too deeply; split it into steps"
            ) from None
    return "\n".join(ev.output)


@tool(timeout_s=5.0)
def python(code: str) -> str:
    """Run a short Python snippet of arithmetic and return what it prints.

    Supports numbers, + - * / // % **, parentheses, variables, print(...) and
    abs/round/min/max/int/float. The value of a final bare expression is shown, like a REPL.

    Args:
        code: The Python code to run, e.g. "x = 347 * 29\\nprint(x + 18)".
    """
    output = safe_exec(code)
    return output if output else "(no output; print(...) a value or end with an expression)"
