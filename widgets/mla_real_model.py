"""The MLA lab's real model: SmolLM2-135M converted to MHA, MQA and MLA (not retrained), stored run and live decode.

    lab = RealModelMlaLab(content.load_entry("multi-head-latent-attention"))
    lab.variant.value = "MLA C=96"        # a row of benchmarks/data/variants_smollm2.json
    lab.reading.formula_bytes             # the content formula for its cache at the stored context
    lab.decode("The cache", 8)            # decode with the converted model, its cache measured from the arrays

Every number of the stored run was measured by benchmarks/variants.py on this project's machine (its date and load
are in the file); the formulas are the content entries'. The live decode converts the published weights with
`dantinox.architectures.convert.load_converted` (MLA: about a minute the first time, then read from the user cache)
and measures the cache the model wrote.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import numpy as np
import traitlets

import content
import dantinox
from dantinox.architectures.convert import load_converted
from dantinox_labs import shipped
from widgets._controls import Lab
from widgets._html import badge, esc, note_box, readout_table
from widgets.number_input import NumberInput
from widgets.readings import cache_formula_bytes

STORED = "variants_smollm2.json"  # written by benchmarks/variants.py


def load_variants(path: str | Path | None = None) -> dict[str, Any]:
    """The stored run of benchmarks/variants.py (default: the shipped copy)."""
    path = shipped.data(STORED) if path is None else Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: the variants run is missing; python benchmarks/variants.py writes it")
    return json.loads(path.read_text())


@dataclasses.dataclass(frozen=True)
class VariantReading:
    """One stored variant beside the content formula for its cache."""

    row: dict[str, Any]  # the stored row (measured)
    cfg: dantinox.ModelConfig  # the converted model's config, as stored
    reference: dict[str, Any]  # the published model's row
    formula_bytes: int  # derived: the content formula at batch 1 and the stored context

    @property
    def residual(self) -> int:
        return self.row["cache_bytes_512"] - self.formula_bytes


def read_variant(entry: Any, kv_entry: Any, stored: dict[str, Any], label: str) -> VariantReading:
    """The stored row named `label` and its cache formula (MLA's latent formula, or the kv-cache formula)."""
    rows = {r["label"]: r for r in stored["rows"]}
    if label not in rows:
        raise ValueError(f"variant: expected one of {', '.join(rows)}, got {label!r}")
    row = rows[label]
    cfg = dantinox.ModelConfig.from_dict(row["config"])
    reference = next(r for r in stored["rows"] if r["convert"] is None)
    return VariantReading(row, cfg, reference, cache_formula_bytes(kv_entry, entry, cfg, 1, stored["context"]))


def calibration_ids(tok: Any, stored: dict[str, Any]) -> np.ndarray:
    """The calibration tokens the stored run converted with (MLA's 2-norm choice), so the live model is its model."""
    cal = stored["calibration"]
    ids = np.asarray(tok.encode(shipped.data(cal["file"]).read_text(encoding="utf-8")), np.int32)[: cal["tokens"]]
    return ids[None]


_lock = threading.Lock()


@functools.cache
def converted(label: str, path: str | None = None) -> tuple[dantinox.ModelConfig, dantinox.Transformer, Any]:
    """The model of a stored row: the published one, or its conversion (kept per process, and MLA on disk)."""
    from widgets.decode_models import load_published

    stored = load_variants(path)
    row = next((r for r in stored["rows"] if r["label"] == label), None)
    if row is None:
        raise ValueError(f"variant: no stored row {label!r}")
    with _lock:  # a click's thread and the notebook may both ask first
        if row["convert"] is None:
            return load_published()
        _, _, tok = load_published()
        cal = calibration_ids(tok, stored) if row["convert"] == "mla" else None
        return load_converted(stored["model"], row["convert"], calibration_ids=cal, **row["options"])


def decode_live(model: dantinox.Transformer, tok: Any, prompt: str, new_tokens: int) -> dict[str, Any]:
    """Greedy continuation of `prompt`, then the cache of the whole text written by the model and measured."""
    ids = tok.encode(prompt)
    if not ids:
        raise ValueError("prompt: expected a non-empty prompt")
    start = time.perf_counter()
    out = np.asarray(dantinox.generate(model, np.asarray([ids], np.int32), new_tokens))[0]
    seconds = time.perf_counter() - start
    cfg = model.cfg
    _, cache, _ = model(out[None], use_cache=True, kv_caches=dantinox.init_cache(cfg, 1, len(out)))
    return dict(text=tok.decode(out[len(ids):].tolist(), skip_special=True), tokens=len(out), seconds=seconds,
                new_tokens=new_tokens, cache_bytes=cache.nbytes,
                formula_bytes=dantinox.kv_cache_bytes(cfg, 1, len(out)),
                payload=type(cache.layers[0]).__name__,
                shapes={k: list(v.shape) for k, v in cache.layers[0]._asdict().items() if v is not None})


class RealModelMlaLab(Lab):
    """Pick a converted SmolLM2 variant: its stored cache, quality and speed; decode a prompt with it live."""

    CONTROLS = ("variant",)
    reading = traitlets.Instance(VariantReading, allow_none=True)
    decoded = traitlets.Dict(allow_none=True, default_value=None)

    def __init__(self, entry: Any, kv_entry: Any = None, *, variant: str = "MLA C=96", path: str | None = None):
        self.entry = entry
        self.kv_entry = content.load_entry("kv-cache") if kv_entry is None else kv_entry
        self.path = path
        self.stored = load_variants(path)
        style, layout = {"description_width": "150px"}, widgets.Layout(width="520px")
        self.variant = widgets.Dropdown(options=[r["label"] for r in self.stored["rows"]], description="variant",
                                        style=style, layout=layout)
        self.readout_html = widgets.HTML()
        self.prompt = widgets.Text(value="The key-value cache of a language model", description="prompt",
                                   style=style, layout=layout)
        self.new_tokens = NumberInput(value=16, min=1, max=64, description="new tokens", unit="tokens", style=style,
                                      layout=layout)
        self.button = widgets.Button(description="decode with this model")
        self.decode_html = widgets.HTML()
        status = widgets.HTML()
        super().__init__([self.variant, status, self.readout_html, self.prompt, self.new_tokens, self.button,
                          self.decode_html], status)
        self.observe_controls(self.variant)
        self.button.on_click(lambda _b: self.guard(lambda: self.decode(self.prompt.value, self.new_tokens.value)))
        self.update(variant=variant)

    def _read(self) -> VariantReading:
        return read_variant(self.entry, self.kv_entry, self.stored, self.variant.value)

    def _render(self, r: VariantReading) -> None:
        s, row, ref = self.stored, r.row, r.reference
        fmt = dantinox.format_bytes
        run = f"stored run, {s['date']}, CPU ({s['machine']['cpus']} cores)"
        tok, ref_tok = row["decode_tok_s"], ref["decode_tok_s"]
        batches = ", ".join(f"{d}: {row['max_batch'][f'{d}/512']:,}" for d in s["devices"])
        self.readout_html.value = note_box(
            f"{esc(row['label'])} is SmolLM2-135M <b>converted, not retrained</b> "
            f"(<code>dantinox.convert_attention(model, to={row['convert'] or 'none'!r})</code>)."
            if row["convert"] else "The published model (GQA, K = 3): the reference the conversions are scored against."
        ) + readout_table([
            ("cache per token (float32, all 30 layers)", f"{row['bytes_per_token']:,.0f} B", badge("measured", run)),
            (f"cache at {s['context']} tokens, arrays", f"{row['cache_bytes_512']:,} B ({fmt(row['cache_bytes_512'])})",
             badge("measured", run)),
            (f"cache at {s['context']} tokens, content formula", f"{r.formula_bytes:,} B",
             badge("derived", "multi-head-latent-attention" if r.cfg.variant == "mla" else "kv-cache")),
            ("residual (measured − formula)", f"{r.residual:,} B", badge("measured", "minus derived")),
            ("perplexity on held-out text (published model)", f"{row['perplexity']:,.1f} ({ref['perplexity']:,.1f})",
             badge("measured", run)),
            ("KL(published ‖ this), top-1 agreement", f"{row['kl']:.3f} nats, {row['top1']:.1%}",
             badge("measured", run)),
            ("decode tok/s at batch 1 / 8 (vs published)",
             f"{tok['1']:.1f} / {tok['8']:.1f} ({tok['1'] / ref_tok['1']:.2f}× / {tok['8'] / ref_tok['8']:.2f}×)",
             badge("measured", run)),
            (f"prefill of {s['context']} tokens", f"{row['prefill_512_s'] * 1e3:.0f} ms "
             f"({row['prefill_512_s'] / ref['prefill_512_s']:.2f}×)", badge("measured", run)),
            ("largest batch at 512 tokens, bf16 cache and weights", batches, badge("derived", "max_batch_size")),
        ])

    def decode(self, prompt: str, new_tokens: int) -> dict[str, Any]:
        """Decode `prompt` with the selected variant's model; the cache it writes is measured beside the formula.

        It takes seconds (a minute the first time: loading, converting, compiling), so the controls are held and
        the live status line says what runs, then what came out."""
        self._set("new_tokens", new_tokens)
        variant = self.variant.value
        with self.working(f"decoding {new_tokens} new tokens with {esc(variant)}: loading the model first (a "
                          "conversion to MLA takes about a minute the first time), then compiling, then seconds",
                          self.variant, self.prompt, self.new_tokens, self.button):
            _, model, tok = converted(variant, self.path)
            d = decode_live(model, tok, prompt, new_tokens)
            self.status_html.value = note_box(f"Decoded {d['new_tokens']} new tokens with {esc(variant)} in "
                                              f"{d['seconds']:.1f} s: the text and its cache are below.")
        self.decoded = d
        self.decode_html.value = (
            f"<div><b>{esc(self.variant.value)}</b>: {esc(prompt)}<b>{esc(d['text'])}</b></div>" + readout_table([
                (f"{d['new_tokens']} new tokens, greedy", f"{d['seconds']:.1f} s (compiling included)",
                 badge("measured")),
                (f"cache of all {d['tokens']} tokens: {d['payload']}, layer 0 "
                 + "; ".join(f"{k} {v}" for k, v in d["shapes"].items()), f"{d['cache_bytes']:,} B",
                 badge("measured", "nbytes of the arrays the model wrote")),
                ("the same from the formula", f"{d['formula_bytes']:,} B", badge("derived", "kv_cache_bytes")),
            ]))
        return d
