"""DantinoX Labs widgets: ipywidgets + plotly components, each in its own module, testable headless.

    import content
    from widgets import CacheLab, CachePlot, ConceptCard, GeneratePanel, Quiz

    entry = content.load_entry("kv-cache")
    ConceptCard(entry)                # any entry: the card, the quiz and the plot helpers are generic
    lab = CacheLab(entry)             # sliders; lab.reading holds the numbers on screen
    CachePlot(lab); GeneratePanel(lab); Quiz(entry, params=lab.formula_params, lab_checks=[0])
    read_kv_cache(entry, cfg, batch, tokens)   # the same numbers without a widget (widgets.readings)
"""

from widgets.cache_lab import CacheLab
from widgets.card import ConceptCard
from widgets.concept_map import ConceptMap, learning_path
from widgets.decode_runs import DecodeRun
from widgets.diffusion_lab import DiffusionLab
from widgets.formula_explorer import ExplorerReading, FormulaExplorer, read_formula
from widgets.generate import GeneratePanel
from widgets.memory_savers_lab import MemorySaversLab, load_measurements
from widgets.mesh_lab import MeshLab, read_mesh
from widgets.mla_lab import MlaLab, decode_path_agreement
from widgets.plot import CachePlot, attention_variants
from widgets.quiz import Quiz, summarise
from widgets.readings import CacheReading, CacheSize, MlaReading, formula_params, read_kv_cache, read_mla_cache
from widgets.real_model_savers_lab import RealModelSaversLab, load_smol_measurements
from widgets.real_models_lab import RealModelsLab, read_real_model
from widgets.roofline_lab import RooflineLab
from widgets.serving_lab import ServingLab, ServingReading, block_table_html, read_serving

__all__ = ["CacheLab", "CachePlot", "ConceptMap", "ExplorerReading", "FormulaExplorer", "learning_path", "read_formula",
           "CacheReading", "CacheSize", "ConceptCard", "DecodeRun", "DiffusionLab",
           "GeneratePanel", "MlaLab", "MlaReading", "Quiz", "attention_variants", "decode_path_agreement",
           "formula_params", "read_kv_cache", "read_mla_cache", "RooflineLab", "summarise",
           "ServingLab", "ServingReading", "block_table_html", "read_serving", "MemorySaversLab", "load_measurements",
           "MeshLab", "read_mesh", "RealModelsLab", "read_real_model", "RealModelSaversLab", "load_smol_measurements"]
