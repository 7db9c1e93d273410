"""The ranges learners explore: each science variable's range or allowed values, and the rules that relate them.

A declared variable gets either a range (`min`, `max`, `default`, and `scale: linear | log`, linear when
omitted) or `values` (a small set of allowed values, shown as a dropdown) with a `default`. It moves in whole
steps when `integer: true`, or when `integer` is omitted and its min, max, default and values are all whole
numbers (`integer: false` keeps a whole-number range continuous).

`check` (called by `content.validate.read_entry`) refuses: a variable with neither or both forms, a default
outside its range or not among its values, a log scale over a range that reaches zero, whole steps over
fractional bounds, a science item whose result is not finite at its variables' defaults, at each end of each
range (the others at their defaults) or at any corner, and a spec whose inputs lie outside the ranges (the
explorer loads them into its sliders with one click, so they must be values a slider can show).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from content import expr
from content.problems import Record
from content.schema import Entry, Science, Variable

MAX_VARIABLES = 12  # every corner is evaluated: 2**12 points at most


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _whole(x: float) -> bool:
    return float(x).is_integer()


def is_integer(var: Variable) -> bool:
    """Whether the variable moves in whole steps (explicit `integer`, else whole-number bounds and values)."""
    if var.integer is not None:
        return var.integer
    numbers = [x for x in (var.min, var.max, var.default, *(var.values or [])) if x is not None]
    return all(_whole(x) for x in numbers)


def bounds(var: Variable) -> tuple[float, float]:
    """(smallest, largest) value the variable can take."""
    if var.values is not None:
        return min(var.values), max(var.values)
    return var.min, var.max


def as_number(var: Variable, value: float) -> int | float:
    """A value in the variable's own type: int for whole-step variables (so `//` and `%` read naturally)."""
    return int(round(value)) if is_integer(var) else float(value)


def describe(var: Variable) -> str:
    """'1 to 128' or 'one of 1, 2, 4': the allowed values, for messages."""
    if var.values is not None:
        return "one of " + ", ".join(_num(v) for v in var.values)
    return f"{_num(var.min)} to {_num(var.max)}"


def contains(var: Variable, value: float) -> bool:
    """Whether a slider for this variable can show `value` exactly."""
    if var.values is not None:
        return value in var.values
    if is_integer(var) and not _whole(value):
        return False
    return var.min <= value <= var.max


def variable_problem(var: Variable) -> tuple[str | None, str] | None:
    """(field, message) for the first rule the variable breaks, or None. field None: the variable itself."""
    has_range = var.min is not None or var.max is not None
    if var.values is not None and has_range:
        return "values", "expected either min and max (a range) or values (allowed values), got both"
    if var.values is not None:
        if var.scale is not None:
            return "scale", f"expected no scale with values (they are shown as a list), got {var.scale!r}"
        if len(set(var.values)) < 2 or len(set(var.values)) != len(var.values):
            return "values", "expected two or more distinct allowed values, got " + \
                (", ".join(_num(v) for v in var.values) or "none")
        if var.default is None or var.default not in var.values:
            got = "none" if var.default is None else _num(var.default)
            return "default", f"expected one of the values {', '.join(_num(v) for v in var.values)}, got {got}"
    elif not has_range:
        return None, "expected min, max and default (a range) or values and default (allowed values), got neither"
    else:
        if var.min is None or var.max is None:
            return ("max" if var.max is None else "min"), \
                f"expected both min and max, got no {'max' if var.max is None else 'min'}"
        if var.max <= var.min:
            return "max", f"expected more than min ({_num(var.min)}), got {_num(var.max)}"
        if var.default is None or not var.min <= var.default <= var.max:
            got = "none" if var.default is None else _num(var.default)
            return "default", f"expected a default from {describe(var)}, got {got}"
        if var.scale == "log" and var.min <= 0:
            return "scale", f"expected a range above zero for a log scale, got min {_num(var.min)}"
    if var.integer:
        fractional = [x for x in (var.min, var.max, var.default, *(var.values or [])) if x is not None
                      and not _whole(x)]
        if fractional:
            return "integer", f"expected whole-number bounds, default and values with integer: true, " \
                f"got {_num(fractional[0])}"
    return None


def corner_points(item: Science) -> Iterator[dict[str, int | float]]:
    """The defaults; each variable at each end with the others at their defaults; then every corner."""
    names = list(item.variables)
    defaults = {n: as_number(item.variables[n], item.variables[n].default) for n in names}
    yield defaults
    for n in names:
        for end in bounds(item.variables[n]):
            yield {**defaults, n: as_number(item.variables[n], end)}
    for combo in itertools.product(*(bounds(item.variables[n]) for n in names)):
        yield {n: as_number(item.variables[n], x) for n, x in zip(names, combo, strict=True)}


def _point_text(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_num(v)}" for k, v in point.items())


def _check_item(rec: Record, i: int, item: Science, tree: Any) -> bool:
    """Variable rules, then finiteness over the ranges; whether the item's ranges are usable."""
    usable = True
    for name, var in item.variables.items():
        problem = variable_problem(var)
        if problem is not None:
            field, message = problem
            rec.problem(("science", i, "variables", name, *([field] if field else [])), message)
            usable = False
    if not usable or tree is None:
        return usable
    if len(item.variables) > MAX_VARIABLES:
        rec.problem(("science", i, "variables"), f"expected at most {MAX_VARIABLES} variables, so every corner "
                    f"of their ranges can be checked, got {len(item.variables)}")
        return False
    for point in corner_points(item):
        try:
            expr.evaluate(tree, point)
        except expr.ExpressionError as err:
            rec.problem(("science", i, "compute"), f"expected a finite result at the defaults, ends and corners "
                        f"of the variables' ranges; at {_point_text(point)}: {err}")
            return False
    return True


def check(rec: Record, entry: Entry, parsed: dict[str, Any]) -> None:
    """Report every range problem of the entry's science items and of the spec inputs loaded into them."""
    usable: dict[str, Science] = {}
    for i, item in enumerate(entry.science):
        if _check_item(rec, i, item, parsed.get(item.title)):
            usable[item.title] = item
    for j, spec in enumerate(entry.specs):
        item = usable.get(spec.compute.science) if spec.compute is not None else None
        if item is None:
            continue
        for name, value in spec.compute.with_.items():
            var = item.variables.get(name)
            if var is not None and not contains(var, value):
                step = " in whole steps" if is_integer(var) and var.values is None else ""
                rec.problem(("specs", j, "compute", "with", name),
                            f"expected a value inside the range of {name} in {item.title!r} "
                            f"({describe(var)}{step}), got {_num(value)}")
