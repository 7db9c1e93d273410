"""Concept entries (content/<id>.yaml): schema, strict loader, safe expression evaluator and checker.

    from dantinox import content
    entry = content.load_entry("kv-cache")
    content.evaluate(entry, "KV cache size", L=12, B=1, T=512, H_kv=8, d_h=32, bytes=2)
    content.check_answer(entry, 0, params={"T": 1024})
"""

from dantinox.content.expr import ExpressionError
from dantinox.content.loader import (
    CONTENT_DIR,
    ContentError,
    Problem,
    check_answer,
    evaluate,
    is_correct,
    iter_numeric_checks,
    load_all,
    load_entry,
    prerequisite_graph,
    render_question,
    validate_files,
)
from dantinox.content.schema import ChoiceCheck, Entry, NumericCheck, Science, Spec

__all__ = [
    "CONTENT_DIR", "ChoiceCheck", "ContentError", "Entry", "ExpressionError", "NumericCheck", "Problem",
    "Science", "Spec", "check_answer", "evaluate", "is_correct", "iter_numeric_checks", "load_all",
    "load_entry", "prerequisite_graph", "render_question", "validate_files",
]
