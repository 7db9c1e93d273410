"""DantinoX Labs widgets: ipywidgets + plotly components, each in its own module, testable headless.

    import content
    from widgets import CacheLab, CachePlot, ConceptCard, GeneratePanel, Quiz

    entry = content.load_entry("kv-cache")
    ConceptCard(entry)                # any entry: the card, the quiz and the plot helpers are generic
    lab = CacheLab(entry)             # sliders; lab.reading holds the numbers on screen
    CachePlot(lab); GeneratePanel(lab); Quiz(entry, params=lab.formula_params, lab_checks=[0])
"""

from widgets.cache_lab import CacheLab, LabReading
from widgets.card import ConceptCard
from widgets.concept_map import ConceptMap, learning_path
from widgets.formula_explorer import ExplorerReading, FormulaExplorer, read_formula
from widgets.generate import DecodeRun, GeneratePanel
from widgets.plot import CachePlot, attention_variants
from widgets.quiz import Quiz, summarise

__all__ = ["CacheLab", "CachePlot", "ConceptMap", "ExplorerReading", "FormulaExplorer", "learning_path", "read_formula",
           "ConceptCard", "DecodeRun", "GeneratePanel", "LabReading", "Quiz",
           "attention_variants", "summarise"]
