"""Answer pairs for the math grader's differential test: (final reply, gold answer), generated
by kind (fractions, radicals, percents, units, equations, intervals, tuples, text, multiple
choice, malformed LaTeX, integers, unboxed replies) plus a hand list."""

from __future__ import annotations

from fractions import Fraction


def _box(s: str) -> str:
    return f"\\boxed{{{s}}}"


def _fractions() -> list[tuple[str, str]]:
    out = []
    for a, b in [(1, 2), (3, 4), (2, 3), (5, 8), (7, 10), (-1, 3), (9, 4), (11, 16)]:
        gold = f"\\frac{{{a}}}{{{b}}}"
        out += [
            (_box(f"{a}/{b}"), gold),
            (_box(f"\\dfrac{{{2 * a}}}{{{2 * b}}}"), gold),
            (_box(f"\\frac{{{a + 1}}}{{{b}}}"), gold),
            (_box(f"{a}/{b + 1}"), gold),
        ]
        if Fraction(a, b).limit_denominator(10**6).denominator in (2, 4, 8, 10, 16):
            out.append((_box(str(float(Fraction(a, b)))), gold))
    return out


def _radicals() -> list[tuple[str, str]]:
    out = []
    for k, m in [(2, 3), (3, 2), (2, 5), (5, 2), (4, 3), (3, 7)]:
        gold = f"{k}\\sqrt{{{m}}}"
        out += [
            (_box(f"\\sqrt{{{k * k * m}}}"), gold),
            (_box(f"\\sqrt{{{k * k * m + 1}}}"), gold),
            (_box(f"{k}\\sqrt{{{m}}}"), gold),
            (_box(f"{k}*\\sqrt{{{m}}}"), gold),
            (_box(f"\\sqrt{{{m}}} \\cdot {k}"), gold),
            (_box(f"{k + 1}\\sqrt{{{m}}}"), gold),
        ]
    return out


def _percents() -> list[tuple[str, str]]:
    out = []
    for p in (5, 10, 25, 50, 75, 12.5):
        out += [
            (_box(f"{p}\\%"), str(p)),
            (_box(f"{p}"), f"{p}\\%"),
            (_box(f"{p + 1}\\%"), str(p)),
            (_box(f"{p} \\%"), str(p)),
            (_box(f"{p}%"), str(p)),
        ]
    return out


def _units() -> list[tuple[str, str]]:
    out = []
    for n, unit in [(5, "cm"), (12, "meters"), (3, "kg"), (100, "dollars"), (7, "m^2")]:
        out += [
            (_box(f"{n} \\text{{ {unit}}}"), str(n)),
            (_box(f"{n}\\,\\mathrm{{{unit}}}"), str(n)),
            (_box(f"{n + 1} \\text{{ {unit}}}"), str(n)),
            (f"The answer is {n} {unit}.", str(n)),
        ]
    return out


def _equations() -> list[tuple[str, str]]:
    out = []
    for v, n in [("x", 3), ("y", -2), ("n", 10), ("a", 7), ("k", 0)]:
        out += [
            (_box(f"{v} = {n}"), str(n)),
            (_box(f"{v}={n + 1}"), str(n)),
            (_box(str(n)), f"{v} = {n}"),
            (_box(f"{v} = {n}"), f"{v} = {n}"),
        ]
    out += [
        (_box("x = 2, x = 3"), "2, 3"),
        (_box("x^2 - 5x + 6 = 0"), "2, 3"),
        (_box("y = 2x + 1"), "y = 2x + 1"),
        (_box("y = 1 + 2x"), "y = 2x + 1"),
    ]
    return out


def _intervals() -> list[tuple[str, str]]:
    out = []
    for gold, right, wrong in [
        ("(1, 2]", "(1,2]", "[1,2]"),
        ("[0, \\infty)", "[0,\\infty)", "(0,\\infty)"),
        ("(-\\infty, 3)", "(-\\infty,3)", "(-\\infty,3]"),
        ("[-1, 1]", "[-1,1]", "(-1,1)"),
        ("(2, 5)", "(2,5)", "(2,6)"),
    ]:
        out += [(_box(right), gold), (_box(wrong), gold), (f"${right}$", gold)]
    out += [(_box("1 < x \\le 2"), "(1, 2]"), (_box("x \\ge 0"), "[0, \\infty)")]
    return out


def _tuples() -> list[tuple[str, str]]:
    out = []
    for a, b in [(1, 2), (3, -1), (0, 5), (2, 2)]:
        gold = f"({a}, {b})"
        out += [
            (_box(f"({a},{b})"), gold),
            (_box(f"({b},{a})"), gold),
            (_box(f"{a}, {b}"), gold),
            (_box(f"({a}, {b}, 0)"), gold),
        ]
    out += [(_box("\\{1, 2, 3\\}"), "\\{3, 2, 1\\}"), (_box("1, 2, 3"), "3, 2, 1")]
    return out


def _text() -> list[tuple[str, str]]:
    out = []
    for word, other in [("yes", "no"), ("even", "odd"), ("Monday", "Tuesday"), ("red", "blue")]:
        gold = f"\\text{{{word}}}"
        out += [
            (_box(word), gold),
            (_box(f"\\text{{{word}}}"), gold),
            (_box(f"\\text{{{other}}}"), gold),
            (_box(word.upper()), gold),
        ]
    return out


def _choices() -> list[tuple[str, str]]:
    out = []
    for c, d in [("A", "B"), ("B", "C"), ("C", "D"), ("D", "E"), ("E", "A")]:
        out += [
            (_box(c), c),
            (_box(f"({c})"), c),
            (_box(d), c),
            (_box(f"\\text{{{c}}}"), c),
            (f"The answer is ({c}).", c),
        ]
    return out


def _malformed() -> list[tuple[str, str]]:
    return [
        ("\\boxed{\\frac{1}{2}", "\\frac{1}{2}"),
        ("\\boxed{\\sqrt{}}", "2"),
        ("\\boxed{", "1"),
        ("\\boxed{1/0}", "1"),
        ("\\boxed{\\frac{1}{0}}", "1"),
        ("\\boxed{\\frac{3}{}}", "3"),
        ("\\boxed{2^{}}", "2"),
        ("\\boxed{)(}", "1"),
        ("\\boxed{\\left( 1, 2}", "(1, 2)"),
        ("\\boxed{x = }", "3"),
        ("\\boxed{\\begin{pmatrix} 1 \\end{pmatrix}}", "1"),
        ("\\boxed{{{7}}}", "7"),
        ("\\boxed{\\sqrt[3]{27}}", "3"),
        ("$$ 7", "7"),
        ("\\boxed{\\dfrac{}{2}}", "0"),
        ("\\boxed{^^}", "1"),
        ("\\boxed{1..5}", "1.5"),
    ]


def _integers() -> list[tuple[str, str]]:
    out = []
    for n in (0, 7, 42, 100, 1024, 1234, 99999, -15, 123456):
        g = str(n)
        out += [
            (_box(g), g),
            (_box(f"{n + 1}"), g),
            (_box(f"{n}.0"), g),
            (_box(f"{n:,}"), g),
            (f"Answer: {n}", g),
            (f"The answer is {n}.", g),
            (f"So the result is ${n}$.", g),
        ]
    for k in (2, 5, 10, 16):
        out += [(_box(f"2^{{{k}}}"), str(2**k)), (_box(f"2^{{{k}}} - 1"), str(2**k))]
    out += [
        (_box("3 \\cdot 4"), "12"),
        (_box("12 \\times 3"), "36"),
        (_box("\\binom{5}{2}"), "10"),
        (_box("5!"), "120"),
        (_box("\\frac{10}{2}"), "5"),
        (_box("1e3"), "1000"),
    ]
    return out


#: Pairs written by hand: the issue's five, and ones a grader commonly gets wrong.
HAND = [
    ("\\boxed{\\sqrt{12}}", "2\\sqrt{3}"),
    ("\\boxed{10\\%}", "10"),
    ("\\boxed{x = 3}", "3"),
    ("\\boxed{2^{10}}", "1024"),
    ("The answer is 7.", "7"),
    ("\\boxed{\\pi}", "\\pi"),
    ("\\boxed{3.14159}", "\\pi"),
    ("\\boxed{\\frac{\\pi}{2}}", "\\pi/2"),
    ("\\boxed{e^{i\\pi}}", "-1"),
    ("\\boxed{\\infty}", "\\infty"),
    ("\\boxed{0.333333}", "1/3"),
    ("\\boxed{0.33}", "1/3"),
    ("\\boxed{1/3}", "0.\\overline{3}"),
    ("\\boxed{2 + 3i}", "3i + 2"),
    ("\\boxed{\\log_2 8}", "3"),
    ("\\boxed{\\sin^2 x + \\cos^2 x}", "1"),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}"),
    ("\\boxed{(x+1)^2}", "x^2+2x+1"),
    ("\\boxed{5} so the answer is 7", "7"),
    ("\\boxed{7} then \\boxed{5}", "5"),
    ("\\boxed{1,234}", "1234"),
    ("\\boxed{1, 234}", "1234"),
    ("no answer here", "3"),
    ("Answer: $\\frac{1}{2}$", "0.5"),
    ("<answer>7</answer>", "7"),
    ("\\boxed{-0}", "0"),
    ("\\boxed{007}", "7"),
    ("\\boxed{+7}", "7"),
    ("\\boxed{7.000}", "7"),
    ("\\boxed{6.99999999}", "7"),
]


def all_pairs() -> list[tuple[str, str]]:
    """Every pair, generated kinds then the hand list, without duplicates, in a fixed order."""
    kinds = (
        _fractions,
        _radicals,
        _percents,
        _units,
        _equations,
        _intervals,
        _tuples,
        _text,
        _choices,
        _malformed,
        _integers,
    )
    pairs = [p for kind in kinds for p in kind()] + HAND
    return list(dict.fromkeys(pairs))
