"""What a screen reader needs that ipywidgets does not give: named slider handles, live feedback, named questions.

    lab = widgets.VBox([*controls, status, Aria()])
    slider.tooltip = "tokens T, 512 tokens"   # what the handle is called (NumberInput keeps its own current)
    feedback.add_class(LIVE)                   # read out when its text changes (role=status, aria-live=polite)
    question.add_class(QUESTION)               # names the choices or the answer box placed after it in its box

ipywidgets draws a slider's description as a `<label>` tied to nothing and gives the slider's handle (the
element a keyboard focuses) no name, so a screen reader says "slider, 3". `Aria`, placed in a box, names every
slider handle and text box in the box (nested boxes too) once they are on the page, and again whenever a value
or a tooltip changes: a handle by its slider's tooltip when the kernel set one (a NumberInput's says quantity,
value and unit, "tokens T, 512 tokens", and shows on hover), else by its description and readout; a text box by
its tooltip ("tokens T in tokens, typed"). It says which of a row of toggle buttons is chosen (aria-pressed; on
screen only its shade does), names a Play widget's icon buttons (play, pause, stop, repeat),
keeps a dropdown's arrow keys from JupyterLab (which would move the notebook's cell selection instead of
choosing an option), makes every element with the LIVE class a polite live region, and names every radio group
or text box that follows a QUESTION element in their box by that question. It draws nothing itself; one per
lab, quiz or panel (each anywidget model must start within anywidget's 2 s, so they are kept few).
"""

from __future__ import annotations

import anywidget
import ipywidgets as widgets

LIVE = "dantinox-live"
QUESTION = "dantinox-question"

_ESM = """
// ipywidgets writes a label's title from the tooltip even when there is none: the string "null"
const tooltip = (label) => (label && label.title !== "null" ? label.title : "");

function name(container) {
  for (const slider of container.querySelectorAll(".widget-slider")) {
    const handle = slider.querySelector(".noUi-handle"), label = slider.querySelector(".widget-label");
    if (!handle || !label) continue;
    // the kernel's spoken name in the label's tooltip (a NumberInput's: "tokens T, 512 tokens"), else the
    // description and the readout
    const readout = slider.querySelector(".widget-readout");
    const value = readout && readout.offsetParent !== null ? readout.textContent.trim()
                                                            : handle.getAttribute("aria-valuetext");
    const text = tooltip(label) || `${label.textContent.trim() || "value"}, ${value}`;
    if (handle.getAttribute("aria-label") !== text) handle.setAttribute("aria-label", text);
    if (readout && readout.getAttribute("aria-label") !== `${label.textContent.trim()}, typed`) {
      readout.setAttribute("aria-label", `${label.textContent.trim()}, typed`);
      readout.setAttribute("role", "textbox");
    }
  }
  for (const text of container.querySelectorAll(".widget-text")) {  // a box named by its (hidden) label's tooltip
    const label = text.querySelector(".widget-label"), box = text.querySelector("input");
    if (box && tooltip(label) && box.getAttribute("aria-label") !== tooltip(label)) {
      box.setAttribute("aria-label", tooltip(label));
    }
  }
  for (const button of container.querySelectorAll(".widget-toggle-button")) {  // which is chosen, not by shade only
    const pressed = String(button.classList.contains("mod-active"));
    if (button.getAttribute("aria-pressed") !== pressed) button.setAttribute("aria-pressed", pressed);
  }
  for (const play of container.querySelectorAll(".widget-play")) {  // four icon-only buttons, in this order
    play.querySelectorAll(":scope > button").forEach((button, i) => {
      const label = ["play", "pause", "stop", "repeat"][i];
      if (label && button.getAttribute("aria-label") !== label) button.setAttribute("aria-label", label);
    });
  }
  for (const select of container.querySelectorAll("select")) {  // its arrow keys are its own, not the notebook's
    if (!select.hasAttribute("data-lm-suppress-shortcuts")) select.setAttribute("data-lm-suppress-shortcuts", "true");
  }
  for (const live of container.querySelectorAll(".dantinox-live")) {
    if (live.getAttribute("aria-live") !== "polite") {
      live.setAttribute("role", "status");
      live.setAttribute("aria-live", "polite");
    }
  }
  for (const question of container.querySelectorAll(".dantinox-question")) {
    if (!question.id) question.id = `question-${Math.random().toString(36).slice(2)}`;
    const group = question.parentElement.querySelector(".widget-radio-box, .widget-text input");
    if (group && group.getAttribute("aria-labelledby") !== question.id) {
      if (group.classList.contains("widget-radio-box")) group.setAttribute("role", "radiogroup");
      group.setAttribute("aria-labelledby", question.id);
    }
  }
}

export default {
  render({ el }) {
    el.dataset.dantinoxStarted = "";  // the model has started (anywidget renders only then)
    let observer = null, timer = null;
    const start = () => {
      const container = el.parentElement;
      if (!container) { timer = setTimeout(start, 50); return; }  // a child is put on the page after it renders
      let queued = false;
      const again = () => { queued = false; name(container); };
      again();
      observer = new MutationObserver((records) => {
        // a plot redraws its own SVG often: nothing there to name, and naming at most once a frame keeps the
        // page free for what it is drawing
        if (queued || records.every(r => r.target.closest && r.target.closest(".js-plotly-plot"))) return;
        queued = true;
        requestAnimationFrame(again);
      });
      observer.observe(container, {subtree: true, childList: true, attributes: true,
                                   attributeFilter: ["aria-valuenow", "aria-valuetext", "title", "class"]});
    };
    start();
    return () => { clearTimeout(timer); if (observer) observer.disconnect(); };
  },
};
"""


class Aria(anywidget.AnyWidget):
    """Names the controls of the box it is placed in and marks its live regions (see the module docstring)."""

    _esm = _ESM

    def __init__(self, **kwargs):
        super().__init__(layout=widgets.Layout(display="none"), **kwargs)
        self.add_class("dantinox-aria")
