"""Concept entries (content/entries/<id>.yaml): schema, strict loader, safe expression evaluator, checker.

Imports neither jax nor dantinox, so validating YAML is quick and the labs' text never depends on the model.

    import content
    entry = content.load_entry("kv-cache")
    content.evaluate(entry, "KV cache size", L=12, B=1, T=512, H_kv=8, d_h=32, bytes=2)
    content.check_answer(entry, 0, params={"T": 1024})
"""

from content.api import (
    check_answer,
    content_version,
    corpus_text,
    device_inputs,
    evaluate,
    is_correct,
    iter_numeric_checks,
    load_all,
    load_entry,
    render_question,
    spec_value,
)
from content.expr import ExpressionError
from content.problems import ContentError, Problem
from content.schema import ChoiceCheck, Entry, NumericCheck, Science, Spec
from content.validate import CONTENT_DIR, prerequisite_graph, validate_files

__all__ = [
    "CONTENT_DIR", "ChoiceCheck", "ContentError", "Entry", "ExpressionError", "NumericCheck", "Problem",
    "Science", "Spec", "check_answer", "content_version", "corpus_text", "device_inputs", "evaluate",
    "is_correct",
    "iter_numeric_checks", "load_all", "load_entry", "prerequisite_graph", "render_question", "spec_value",
    "validate_files",
]
