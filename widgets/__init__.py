"""DantinoX Labs widgets: ipywidgets + plotly components, each in its own module, testable headless.

    import content
    from widgets import CacheLab, CachePlot, ConceptCard, GeneratePanel, Quiz

    entry = content.load_entry("kv-cache")
    ConceptCard(entry)                # any entry: the card, the quiz and the plot helpers are generic
    lab = CacheLab(entry)             # sliders; lab.reading holds the numbers on screen
    CachePlot(lab); GeneratePanel(lab); Quiz(entry, params=lab.formula_params, lab_checks=[0])
    read_kv_cache(entry, cfg, batch, tokens)   # the same numbers without a widget (widgets.readings)

A name is imported from its module on first use, so the content-only widgets (the concept map, the formula
explorer, the card, the quiz) load without the model library and JAX: that is what the browser site runs.
"""

from __future__ import annotations

import importlib
from typing import Any

_MODULES = {  # public name -> the module that defines it
    "cache_lab": ["CacheLab"],
    "cache_fill_panel": ["CacheFillPanel"],
    "card": ["ConceptCard"],
    "concept_map": ["ConceptMap", "learning_path"],
    "decode_runs": ["DecodeRun"],
    "diffusion_lab": ["DiffusionLab"],
    "exercises.widget": ["DecodeCheck", "ExerciseCheck"],
    "formula_explorer": ["ExplorerReading", "FormulaExplorer", "read_formula"],
    "generate": ["GeneratePanel"],
    "memory_savers_lab": ["MemorySaversLab", "load_measurements"],
    "mesh_lab": ["MeshLab", "read_mesh"],
    "mla_lab": ["MlaLab", "decode_path_agreement"],
    "mla_real_model": ["RealModelMlaLab", "load_variants", "read_variant"],
    "plot": ["CachePlot", "attention_variants"],
    "quiz": ["Quiz", "summarise"],
    "readings": ["CacheReading", "CacheSize", "MlaReading", "formula_params", "read_kv_cache", "read_mla_cache"],
    "real_model_savers_lab": ["RealModelSaversLab", "load_smol_measurements"],
    "real_models_lab": ["RealModelsLab", "read_real_model"],
    "roofline_lab": ["RooflineLab"],
    "serving_lab": ["ServingLab", "ServingReading", "page_table_html", "read_serving"],
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'widgets' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"widgets.{module}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
