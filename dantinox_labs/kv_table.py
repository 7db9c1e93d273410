"""The readable form of a KV-cache ledger (`dantinox kv` without --json): runs of equal layers on one line."""

from __future__ import annotations

from dantinox.accounting.kv_ledger import Ledger, state_crossover_tokens
from dantinox.accounting.memory import format_bytes
from dantinox.accounting.peer_allocation import llama_cpp_column, vllm_column
from dantinox.architectures.catalogue import Architecture

WORKING = {
    "working model arrays": "measured from the arrays of a working model with this per-layer cache geometry (narrow "
                            "widths, random weights) after it prefilled and decoded",
    "working model shapes": "over the memory guard, nothing allocated: the shapes (jax.eval_shape, not an "
                            "allocation) of the cache a working model with this geometry prefills and decodes with",
}


def _runs(ledger: Ledger) -> list[tuple[str, object]]:
    """Consecutive rows that differ only in their layer number, as ("3-7", row) pairs."""
    runs: list[list] = []
    for row in ledger.rows:
        key = (row.kind, row.slots, row.elements_per_slot, row.bytes, row.measured_bytes, row.formula, row.kv_heads,
               row.head_size)
        if runs and runs[-1][2] == key and runs[-1][1] == row.layer - 1:
            runs[-1][1] = row.layer
        else:
            runs.append([row.layer, row.layer, key, row])
    return [(str(a) if a == b else f"{a}-{b}", row) for a, b, _, row in runs]


def engine_lines(arch: Architecture, ledger: Ledger) -> list[str]:
    """The engine columns (derived from vLLM's and llama.cpp's sources, see dantinox/accounting/peer_allocation.py)."""
    lines = ["engines (derived from their sources, dantinox/accounting/peer_allocation.py):"]
    budget = None
    if ledger.fit is not None and ledger.fit.weight_bytes is not None:
        budget = max(ledger.fit.capacity_bytes - ledger.fit.weight_bytes, 0)
    try:
        hybrid = vllm_column(arch, ledger.tokens, ledger.batch, ledger.cache_dtype, budget_bytes=budget)
        plain = vllm_column(arch, ledger.tokens, ledger.batch, ledger.cache_dtype, hybrid_allocator=False)
    except ValueError as e:
        lines.append(f"  vLLM: {e}")
    else:
        lines.append(f"  vLLM, 16-token pages: {format_bytes(hybrid.total_bytes)} with its hybrid allocator, "
                     f"{format_bytes(plain.total_bytes)} without")
        if hybrid.log_line:
            lines.append(f"  vLLM for the {format_bytes(budget)} left after the weights: {hybrid.log_line}")
        lines += [f"  vLLM: {note}" for note in hybrid.notes]
    try:
        column = llama_cpp_column(arch, ledger.tokens, ledger.cache_dtype)
    except ValueError as e:
        lines.append(f"  llama.cpp: {e}")
    else:
        lines.append(f"  llama.cpp at n_ctx {ledger.tokens:,}, one sequence ({column.notes[0]}):")
        lines += [f"    {line}" for line in column.log_line.splitlines()]
    return lines


def ledger_table(ledger: Ledger, arch: Architecture | None = None) -> str:
    lines = [f"{ledger.model}: KV cache at T = {ledger.tokens:,} tokens, B = {ledger.batch}, cache dtype "
             f"{ledger.cache_dtype}", f"config: {ledger.source}", "",
             f"{'layers':>8}  {'kind':8} {'K×H':>8} {'slots':>10} {'elem/slot':>10} {'bytes (each layer)':>20}  "
             "measured  formula"]
    formulas: dict[str, str] = {}  # each distinct formula once, under a letter
    width = 20 if ledger.from_working_model else 9
    if ledger.from_working_model:
        lines[-1] = lines[-1].replace("  measured  ", f"  {'measured (each layer)':>{width}}  ")
    for layers, row in _runs(ledger):
        mark = formulas.setdefault(row.formula, f"[{chr(ord('a') + len(formulas))}]")
        if row.derived:
            measured = "derived"
        elif row.measured_bytes is None:
            measured = "-"
        elif ledger.from_working_model:
            measured = f"{row.measured_bytes:,}" + ("" if row.measured_bytes == row.bytes else " (differs)")
        else:
            measured = "= formula" if row.measured_bytes == row.bytes else f"{row.measured_bytes:,} (differs)"
        heads = "-" if row.kv_heads is None else f"{row.kv_heads}×{row.head_size}"
        lines.append(f"{layers:>8}  {row.kind:8} {heads:>8} {row.slots:>10,} {row.elements_per_slot:>10,} "
                     f"{row.bytes:>20,}  {measured:>{width}} {mark}")
    lines += ["", *(f"{mark} {formula}" for formula, mark in formulas.items())]
    how = (WORKING[ledger.measured_from] if ledger.from_working_model
           else "measured from dantinox's cache shapes (jax.eval_shape)")
    derived = sum(row.derived for row in ledger.rows)
    if derived and not ledger.from_working_model:  # rows dantinox builds no cache for count at their formula
        how += f", the {derived} derived layer{'s' if derived > 1 else ''} at the formula"
    lines += ["", f"total: {ledger.total_bytes:,} B ({format_bytes(ledger.total_bytes)}); {how}: "
              f"{ledger.measured_bytes:,} B",
              f"per token: one more token adds {ledger.per_token_bytes:,} B to a sequence at T = {ledger.tokens:,}",
              *([f"read per decode step (derived): {ledger.read_total_bytes:,} B "
                 f"({format_bytes(ledger.read_total_bytes)}) of the {ledger.total_bytes:,} B stored: every indexer "
                 "key, only the top-k latents"] if ledger.reads_less_than_stored else []),
              *([f"read per decode step, measured from the arrays the working model's last step read (the "
                 f"latents its top-k selection gathered, the indexer keys it scored): "
                 f"{ledger.measured_read_total_bytes:,} B"]
                if ledger.reads_less_than_stored and ledger.from_working_model else []),
              f"naive calculator: {ledger.naive_formula} = {ledger.naive_bytes:,} B "
              f"({format_bytes(ledger.naive_bytes)}), {ledger.naive_error_pct:+.1f} % against the ledger"]
    lines += [f"  - {term}" for term in ledger.gap_terms]
    crossover = None if arch is None else state_crossover_tokens(arch, ledger.cache_dtype)
    if crossover is not None:
        lines.append(f"crossover (derived): from T = {crossover:,} tokens on, the attention layers' K/V take more "
                     "bytes than the constant states of the linear-attention / Mamba-2 / convolution layers")
    lines += [f"note: {note}" for note in ledger.notes]
    fit = ledger.fit
    if fit is not None:
        lines.append(f"device {fit.device}: capacity {fit.capacity_bytes:,} B ({format_bytes(fit.capacity_bytes)})")
        if fit.weight_bytes is None:
            lines.append(f"  weights {fit.weights_source}")
        else:
            lines.append(f"  weights {fit.weight_bytes:,} B ({format_bytes(fit.weight_bytes)}; {fit.weights_source})"
                         f"; left for the cache {format_bytes(max(fit.capacity_bytes - fit.weight_bytes, 0))}")
            if fit.capacity_bytes <= fit.weight_bytes:
                lines.append("  the weights alone do not fit on this device")
            else:
                cap = " (the model's max_position_embeddings)" if fit.max_context == ledger.max_context else ""
                lines.append(f"  max context at B = {ledger.batch}: {fit.max_context:,} tokens{cap}; max batch at "
                             f"T = {ledger.tokens:,}: {fit.max_batch:,} sequences")
    if arch is not None:
        lines += engine_lines(arch, ledger)
    return "\n".join(lines)
