"""What the browser test does in each lab, as data: the slider to move, the button to press, what must follow.

A notebook in labs/ with no entry here gets DEFAULT: its first slider must change a readout the kernel
writes, and its first quiz question (whose "check" is then the button pressed) must give feedback. A lab
where that does not fit (no slider, no quiz, or a button worth pressing) gets its own entry.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Press:
    """A button to click, found by its visible label (or a CSS selector), and what must happen in its cell."""

    label: str = ""  # the button's text, matched exactly
    selector: str = ""  # when the button has no text (the Play widget's icons)
    expect: str = "changes"  # a regex the cell's kernel-written text must match afterwards, or "changes"
    timeout_s: float = 120.0  # decoding compiles first; the rest answers in well under a second
    typed: tuple[tuple[str, str], ...] = ()  # (slider description, value) typed into slider boxes before the click
    busy: str = ""  # a regex the button's own text must match, disabled, soon after the click (long work says so)
    # A button the kernel disables while it works (decode) is waited for until it is enabled again.


@dataclasses.dataclass(frozen=True)
class LabSpec:
    slider: str | None = None  # a slider's description; None: the notebook's first slider
    has_slider: bool = True  # False: a lab of typed code and buttons (the exercises); no slider is moved
    key: str = "ArrowRight"  # the key pressed on the focused slider handle, as a learner would
    presses: tuple[Press, ...] = ()  # in order; none: the quiz's "check" is the lab's button
    quiz: bool = True  # answer the first multiple-choice question and expect "Correct." or "Not quite."
    screenshot: str | None = None  # text inside the cell to photograph; None: the slider's (or first plot's) cell
    interactive: bool = True  # False: a notebook of static plots and tables; it must run clean and draw them
    scenarios: tuple[str, ...] = ()  # names in test_labs.SCENARIOS: longer walks, run after the presses
    reopen: bool = False  # day two: save the run lab, close it, reopen it twice; no widget may show broken
    # True: a slider's value runs once the slider settles (the diffusion lab compiles for a new size); the
    # keyboard walk moves each slider there and back before it does
    settles: bool = False
    seconds: float = 30.0  # about how long its JupyterLab browser test takes here: the shares are balanced by it
    # True: a lab the course site also serves runs in a browser there (tests/browser/test_site.py, JupyterLite on
    # Pyodide) with its slider, press, quiz and scenarios, and not a second time in JupyterLab
    in_site: bool = False


DEFAULT = LabSpec()

SPECS: dict[str, LabSpec] = {
    # decodes SmolLM2 with the cache at B=1, then the tiny run without it at B=2: the panel must refuse to compare
    # (16 new tokens, not the panel's 96: test_widgets_generate decodes the default; here the press must work)
    "kv-cache": LabSpec(slider="tokens T",
                        presses=(Press(label="decode with KV cache", expect=r"cache per token.*23,040 B.*tokens/s",
                                       typed=(("new tokens", "16"),),
                                       timeout_s=240.0),),  # loads and compiles SmolLM2-135M first
                        scenarios=("decode_ratio_needs_equal_settings",),
                        screenshot="decode with KV cache",
                        seconds=44),
    "mla": LabSpec(slider="latent width C", presses=(Press(label="numbers from my lab settings"),), reopen=True,
                   seconds=43),
    "instructor": LabSpec(interactive=False, seconds=11),  # the class dashboard: plotly figures over stored answers
    "mesh": LabSpec(slider="batch B", seconds=17),  # the device grid and table follow; the quiz is the GQA entry's
    "diffusion": LabSpec(slider="threshold", key="ArrowLeft",
                         presses=(Press(selector=".widget-play button >> nth=0", timeout_s=20.0),),
                         scenarios=("stop_new_sizes",), settles=True, seconds=33),
    # the concept map's explorer (kv-cache): a variable's slider, then one published spec loaded into the sliders;
    # run in the course site, where a learner without the install meets it
    "concepts": LabSpec(slider="T [tokens]",
                        presses=(Press(label="load: dantinox reference model, one sequence, bf16 cache"),),
                        scenarios=("explorer_after_switching_entry",), in_site=True),
    # the ring-buffer view: which slots a local layer holds; the frontier's labels must be readable, and a click
    # on one of its points selects that configuration
    "memory-savers": LabSpec(slider="tokens decoded", scenarios=("labels_clear", "point_click_selects"), seconds=39),
    # "time this model here" is pressed only to be stopped (its whole sweep took 16 s of a 70 s test here);
    # tests/test_roofline.py presses it and checks its readings; the profile runs once whole, once stopped
    "roofline": LabSpec(slider="batch B", presses=(
        Press(label="where does a step's time go?", expect=r"attention over the cache.*GB/s", timeout_s=120.0,
              busy=r"working"),),
        scenarios=("stop_the_timing", "stop_the_profile"), seconds=45),
    # re-serves the trace: waste bar and page tables follow; every label readable, no readout cut off
    # a published model's ledger: the T stops are powers of two up to the model's context; then its working model
    # decodes a typed number of tokens (a new cache length: built and compiled again) and the fill is read back
    "real-models": LabSpec(slider="tokens T (log)", presses=(
        Press(label="decode and watch the cache fill", typed=(("decode tokens", "200"),), busy=r"decoding",
              expect=r"step 200 of 200.*measured = ledger.*at every step so far", timeout_s=120.0),),
        seconds=45),
    "serving": LabSpec(slider="page size (tokens)", scenarios=("labels_clear",), seconds=30),
    # code typed into exercise (d)'s cell, wrong then right, each checked; the decode button loads
    # SmolLM2-135M (the tiny run without its wheel) and answers that the skeletons are still skeletons
    "exercises": LabSpec(has_slider=False, quiz=False,
                         # (d)'s check after its scenario: the verdict and the first hint (text only its output has)
                         screenshot="Hint 1: Position p lives in slot p mod slots; the newest position is length - 1.",
                         presses=(Press(label="run my cache in the model", expect=r"write_token, attend_one: not "
                                        r"defined yet|decode \(SmolLM2-135M|decode \(the tiny"),),
                         scenarios=("exercise_typed_solution",), seconds=35),
}


def spec_for(stem: str) -> LabSpec:
    """The spec of labs/<stem>.ipynb."""
    return SPECS.get(stem, DEFAULT)


def shares(stems: list[str], workers: int = 2) -> dict[str, int]:
    """Which of `workers` shares (test files, so workers) runs each lab in JupyterLab: the longest first, each to
    the least loaded share. A lab run in the course site instead (`in_site`) is in no share."""
    load, share = [0.0] * workers, {}
    for stem in sorted((s for s in stems if not spec_for(s).in_site), key=lambda s: (-spec_for(s).seconds, s)):
        share[stem] = min(range(workers), key=lambda w: (load[w], w))
        load[share[stem]] += spec_for(stem).seconds
    return share
