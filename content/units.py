"""Units and number formatting for content: scaled units of one quantity, and how values read on screen."""

from __future__ import annotations

import math
import re

# A numeric check may ask for its answer in a scaled form of the science item's unit.
UNIT_FAMILIES: tuple[dict[str, float], ...] = (
    {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
     "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12},
    {"s": 1, "ms": 1e-3, "us": 1e-6},
    {"B/s": 1, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12},
    {"params": 1, "thousand params": 1e3, "million params": 1e6, "billion params": 1e9},
)


def unit_factor(target: str, base: str) -> float | None:
    """How many `base` units make one `target` unit; None if they are not the same kind of quantity."""
    if target == base:
        return 1.0
    for family in UNIT_FAMILIES:
        if target in family and base in family:
            return family[target] / family[base]
    return None


def format_value(value: float, fmt: str, unit: str) -> str:
    if fmt == "bytes":
        return format_bytes(value)
    if fmt == "times":
        return f"{number_text(value)}×"
    if fmt == "percent":
        return f"{number_text(100 * value)}%"
    if fmt == "seconds":
        for scale, name in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")):
            if abs(value) >= scale or name == "µs":
                return f"{number_text(value / scale)} {name}"
    return f"{number_text(value)} {unit}".strip()


def number_text(value: float) -> str:
    """4096 -> '4,096'; 2.25 -> '2.25'; 0.01757 -> '0.0176' (three significant decimals at most)."""
    if float(value).is_integer() and abs(value) < 2**53:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.1f}".rstrip("0").rstrip(".")
    return f"{value:.3g}" if abs(value) < 1 else f"{value:,.3f}".rstrip("0").rstrip(".")


def format_bytes(n: float) -> str:
    """Binary units, as byte formulas' powers of two read best: 6 MiB, 1.5 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            text = f"{n:,.0f}" if unit == "B" else f"{n:,.3f}".rstrip("0").rstrip(".")
            return f"{text} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def param_text(value: float) -> str:
    """How a parameter reads in a question: 4,096; 0.9; 4.8 × 10¹² for very large or small values."""
    if value and (abs(value) >= 1e7 or abs(value) < 1e-3):
        exponent = math.floor(math.log10(abs(value)))
        mantissa = f"{value / 10**exponent:.4g}"
        return f"{mantissa} × 10{str(exponent).translate(_SUPERSCRIPT)}"
    return number_text(value) if float(value).is_integer() else f"{value:g}"


def tolerance_text(tolerance: float) -> str:
    """A relative tolerance as a learner reads it: 0.004 -> '±0.4 %', 0.05 -> '±5 %' (never '±0 %')."""
    return f"±{100 * tolerance:.2g} %"


# a comma only groups thousands: 4,096 and 6,291,456.5, never 2,91 (a decimal comma, refused) or 40,96
_GROUPED = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?([eE][+-]?\d+)?")


def parse_number(text: str) -> float:
    """A typed number: '4096', '4,096', '6.4e9', '1/8'; anything else (or a zero divisor) raises ValueError.

    A comma is read only as a thousands separator between groups of three digits; any other comma ('2,91',
    a decimal comma) is refused with a message asking for a decimal point, never read as 291.
    """
    cleaned = text.strip().replace("_", "").replace(" ", "")
    parts = cleaned.split("/")
    if len(parts) > 2 or not all(parts):
        raise ValueError(f"expected a number, got {text!r}")
    if any("," in part and not _GROUPED.fullmatch(part) for part in parts):
        raise ValueError(f"expected a number with a decimal point (2.91) and commas only between groups of "
                         f"three digits (4,096), got {text!r}")
    parts = [part.replace(",", "") for part in parts]
    numbers = [float(part) for part in parts]  # 'abc' raises ValueError here
    if len(numbers) == 2 and numbers[1] == 0:
        raise ValueError(f"expected a number, got {text!r} (a zero divisor)")
    value = numbers[0] / numbers[1] if len(numbers) == 2 else numbers[0]
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {text!r}")
    return value
