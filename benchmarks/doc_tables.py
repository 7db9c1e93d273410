"""The published-model benchmark tables, rendered from their stored results (benchmarks/data/*.json).

    .venv/bin/python benchmarks/doc_tables.py          # rewrite the marked blocks in docs/benchmarks.md and README.md

`benchmarks/decode.py --model smollm2-135m --peer`, `benchmarks/llamacpp.py`, `benchmarks/serving.py --part engine`
and `benchmarks/memory_savers.py --part smollm2` / `--part smollm2-chat` store their numbers in
benchmarks/data/; the docs hold what this module renders from them between `<!-- table: NAME -->` and
`<!-- end table: NAME -->`, and tests/test_benchmark_docs.py fails when a block drifts from its JSON.
Imports neither jax nor dantinox.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
ROOT = HERE.parent
DOCS = (ROOT / "docs" / "benchmarks.md", ROOT / "README.md", ROOT / "docs" / "engine_logs.md")


def _load_range(loads: list[float]) -> str:
    return f"{min(loads):.1f}–{max(loads):.1f}" if len(loads) > 1 else f"{loads[0]:.1f}"


def decode_pretrained(r: dict) -> str:
    """benchmarks/decode.py --model NAME --peer: tok/s per weight mode and batch, % of roofline, ratio to the peer."""
    m = r["machine"]
    peer = "peer_tok_s" in r
    warm = ("" if r.get("warmup", True) else " (no untimed warm-up: every program came from the persistent "
                                                "compilation cache of an earlier run)")
    lines = [f"{r['model']}, prompt {r['prompt']}, {r['new']} new tokens, end-to-end `generate()`, best of "
             f"{r['rounds']} interleaved round(s){warm}, {m['cpus']} CPU cores, measured {r['date']} (1-minute "
             f"load average {_load_range(m['load_avg_1min'])} during the run: the machine is shared). Streaming read "
             f"{m['bandwidth_B_s'] / 1e9:.1f} GB/s (best of the {len(m['bandwidth_samples_B_s'])} probe(s) of the "
             f"run; all: {', '.join(f'{b / 1e9:.1f}' for b in m['bandwidth_samples_B_s'])}), f32 matmul "
             f"{m['matmul_flop_s'] / 1e9:.0f} GFLOP/s:", "",
             "| weights | weight bytes | batch | dantinox tok/s | % of roofline |"
             + (" HF (f32, static cache) tok/s | ratio |" if peer else ""),
             "|---|---|---|---|---|" + ("---|---|" if peer else "")]
    for key, ours in r["decode_tok_s"].items():
        mode, batch = key.rsplit("/", 1)
        share = r["roofline_s"][key] / (int(batch) * r["new"] / ours)
        row = f"| {mode} | {r['weight_bytes'][mode] / 1e6:,.0f} MB | {batch} | {ours:,.1f} | {share:.0%} |"
        if peer:
            theirs = r["peer_tok_s"][f"{r['model']}/{batch}"]
            row += f" {theirs:,.1f} | {ours / theirs:.2f}× |"
        lines.append(row)
    if peer:
        lines += ["", *targets(r)]
    return "\n".join(lines)


def targets(r: dict) -> list[str]:
    """The speed targets judged on this run: >= 3x the peer at every batch, >= 70 % of the roofline at batch 1."""
    out = []
    for batch in sorted({int(k.rsplit("/", 1)[1]) for k in r["decode_tok_s"]}):
        mode, ours = max(((k.rsplit("/", 1)[0], v) for k, v in r["decode_tok_s"].items()
                          if k.endswith(f"/{batch}")), key=lambda kv: kv[1])
        ratio = ours / r["peer_tok_s"][f"{r['model']}/{batch}"]
        line = (f"- Batch {batch}: fastest mode {mode}, {ratio:.2f}× the peer "
                f"({'meets' if ratio >= 3 else 'misses'} the ≥ 3× target)")
        if batch == 1:
            share = r["roofline_s"][f"{mode}/1"] / (r["new"] / ours)
            line += f"; {share:.0%} of its roofline ({'meets' if share >= 0.7 else 'misses'} the ≥ 70 % target)"
        out.append(line + ".")
    return out


def llama_cpp(r: dict) -> str:
    """benchmarks/llamacpp.py: llama.cpp's batch-1 tok/s per GGUF file and its KV buffer next to dantinox's."""
    built = (f"built here in {r['build_minutes']:.0f} min" if r["build_minutes"] == r["build_minutes"]
             else "build time not recorded")  # NaN when the venv was built by hand
    lines = [f"llama.cpp (llama-cpp-python {r['llama_cpp_python']}, {built}), "
             f"{r['model']}, prompt {r['prompt']}, {r['new']} new tokens at batch 1, best of {r['repeats']}, "
             f"{r['threads']} threads, measured {r['date']} (1-minute load average {_load_range(r['load_avg_1min'])}):",
             "", "| GGUF file | file size | llama.cpp tok/s |", "|---|---|---|"]
    for row in r["files"]:
        lines.append(f"| {row['type']} | {row['bytes'] / 1e6:,.0f} MB | {row['tok_s']:,.1f} |")
    kv = r["kv_cache"]
    lines += ["", f"KV cache at n_ctx = {kv['n_ctx']:,} tokens, batch 1, {kv['dtype']} K and V:", "",
              "| | bytes | MiB |", "|---|---|---|",
              f"| llama.cpp's log (`{kv['llama_line']}`) | {kv['llama_bytes']:,} | {kv['llama_bytes'] / 2**20:,.2f} |",
              f"| dantinox `init_cache(cfg, 1, {kv['n_ctx']}).nbytes` | {kv['dantinox_bytes']:,} | "
              f"{kv['dantinox_bytes'] / 2**20:,.2f} |",
              f"| formula L · 2 · T · K · H · bytes | {kv['formula_bytes']:,} | {kv['formula_bytes'] / 2**20:,.2f} |"]
    return "\n".join(lines)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


def decode_reference(r: dict) -> str:
    """benchmarks/decode.py --grid --peer: the reference grid against Hugging Face, taking turns round by round."""
    m = r["machine"]
    lines = [f"Reference model, prompt {r['prompt']}, {r['new']} new tokens, end-to-end `generate()` against Hugging "
             f"Face's static cache (torch {r['peer'].get('torch', '?')}, transformers "
             f"{r['peer'].get('transformers', '?')}), {r['rounds']} rounds taking turns, {m['cpus']} CPU cores, "
             f"measured {r['date']}; 1-minute load average {r['load_avg_1min'][0]:.1f} before, "
             f"{r['load_avg_1min'][-1]:.1f} after ({_load_range(r['load_avg_1min'])} at the rounds' ends). "
             f"Streaming read {m['bandwidth_B_s'] / 1e9:.1f} GB/s (best of the run's "
             f"{len(m['bandwidth_samples_B_s'])} probes: "
             f"{', '.join(f'{b / 1e9:.1f}' for b in m['bandwidth_samples_B_s'])}), f32 matmul "
             f"{m['matmul_flop_s'] / 1e9:.0f} GFLOP/s. tok/s: median of the rounds (slowest–fastest):", "",
             "| variant | batch | dantinox tok/s | % of roofline | HF tok/s | dantinox / HF |",
             "|---|---|---|---|---|---|"]
    out = []
    for k, runs in r["decode_tok_s"].items():
        variant, batch = k.split("/")
        ours, theirs = _median(runs), _median(r["peer_tok_s"][k])
        share = r["roofline_s"][k] / (int(batch) * r["new"] / ours)
        lines.append(f"| {variant} | {batch} | {ours:,.0f} ({min(runs):,.0f}–{max(runs):,.0f}) | {share:.0%} | "
                     f"{theirs:,.0f} ({min(r['peer_tok_s'][k]):,.0f}–{max(r['peer_tok_s'][k]):,.0f}) | "
                     f"{ours / theirs:.2f}× |")
        ratio = ours / theirs
        line = f"- {variant}, batch {batch}: {ratio:.2f}× HF ({'meets' if ratio >= 3.5 else 'misses'} ≥ 3.5×)"
        if batch == "8":
            line += f", {share:.0%} of the roofline ({'meets' if share >= 0.5 else 'misses'} ≥ 50 %)"
        out.append(line + ".")
    return "\n".join([*lines, "", *out])


def llama_cpp_steps(r: dict) -> str:
    """benchmarks/llamacpp.py --part context / batch: ms per decode step on both sides, taking turns."""
    m = r["machine"]
    short, long = r["steps"]
    flags = f"CMAKE_ARGS {r['cmake_args']!r}" if r["cmake_args"] else "no CMAKE_ARGS (llama.cpp's default build)"
    lines = [f"{r['model']}, decode steps alone: {r['rounds']} rounds taking turns, each turn (t({long}) − "
             f"t({short})) / {long - short} steps"
             + (f" (each length the best of {r['repeats']} calls)" if r["repeats"] > 1 else "")
             + f"; {r['threads']} threads each; measured {r['date']}; 1-minute load average "
             f"{r['load_avg_1min'][0]:.1f} before, {r['load_avg_1min'][-1]:.1f} after "
             f"({_load_range(r['load_avg_1min'])} at the rounds' ends). llama-cpp-python {r['llama_cpp_python']} "
             f"({flags}; `llama_print_system_info`: `{r['system_info']}`), jax {r['jax']}. Streaming read "
             f"{m['bandwidth_B_s'] / 1e9:.1f} GB/s (best of the run's {len(m['bandwidth_samples_B_s'])} probes: "
             f"{', '.join(f'{b / 1e9:.1f}' for b in m['bandwidth_samples_B_s'])}), f32 matmul "
             f"{m['matmul_flop_s'] / 1e9:.0f} GFLOP/s. Step times: median of the rounds (fastest–slowest):", "",
             "| dantinox / llama.cpp | batch | slots | weights + cache read per step | dantinox ms/step | "
             "llama.cpp ms/step | dantinox tok/s | llama.cpp tok/s | llama.cpp / dantinox step | dantinox % of "
             "roofline | llama.cpp % of roofline |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        ours, theirs = _median(row["ours_ms"]), _median(row["theirs_ms"])
        spread = [f"{_median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})" for xs in (row["ours_ms"], row["theirs_ms"])]
        lines.append(f"| {row['label']} | {row['batch']} | {row['context']:,} | {row['weight_bytes'] / 1e6:,.0f} + "
                     f"{row['cache_read_bytes'] / 1e6:,.0f} MB | {spread[0]} | {spread[1]} | "
                     f"{1e3 * row['batch'] / ours:,.1f} | {1e3 * row['batch'] / theirs:,.1f} | {theirs / ours:.2f}× | "
                     f"{row['roofline_ms'] / ours:.0%} | {row['roofline_ms'] / theirs:.0%} |")
    lines += ["", *steps_targets(r)]
    setups = {}
    for row in r["rows"]:
        t = row["theirs"]
        setups.setdefault(f"{t['file']} file, {t['kv_type']} K/V, flash_attn {t['flash_attn']}, batch {t['batch']}",
                          {})[row["context"]] = "; ".join(row["llama_log"])
    lines += ["", "llama.cpp's log for its contexts (n_ctx = batch × slots, n_seq_max = batch):"]
    for setup, logs in setups.items():
        lines += [f"- {setup}: " + " / ".join(f"{c:,} slots: `{text}`" for c, text in logs.items())]
    return "\n".join(lines)


def steps_targets(r: dict) -> list[str]:
    """The issue's targets judged on this run's medians: the long-context cells (bf16 cache: >= 75 % of the
    roofline and >= 1.2x llama.cpp), batch 8 (>= 50 % of the roofline) and float32 (>= llama.cpp's F32)."""
    out = []
    for row in r["rows"]:
        ours, theirs = _median(row["ours_ms"]), _median(row["theirs_ms"])
        share, ratio = row["roofline_ms"] / ours, theirs / ours
        where = f"{row['label']}, batch {row['batch']}, {row['context']:,} slots"
        if r["part"] == "context" and row["ours"]["cache_dtype"] == "bfloat16":
            out.append(f"- {where}: {share:.0%} of the roofline ({'meets' if share >= 0.75 else 'misses'} ≥ 75 %), "
                       f"{ratio:.2f}× llama.cpp ({'meets' if ratio >= 1.2 else 'misses'} ≥ 1.2×).")
        elif r["part"] == "batch" and row["batch"] == 8:
            out.append(f"- {where}: {share:.0%} of the roofline ({'meets' if share >= 0.5 else 'misses'} ≥ 50 %), "
                       f"{ratio:.2f}× llama.cpp with 8 sequences in one batch.")
        elif r["part"] == "batch" and row["ours"]["param_dtype"] is None and row["ours"]["dtype"] == "float32":
            out.append(f"- {where}: {ratio:.2f}× llama.cpp's F32 file ({'meets' if ratio >= 1 else 'misses'} ≥ 1×).")
    return out


def decode_profile(r: dict) -> str:
    """benchmarks/decode_profile.py --smollm2: its table as printed, and when and how busy the machine was."""
    loads = r["load_avg_1min"]
    return (f"{r['table']}\n\nMeasured {r['date']} (1-minute load average {loads[0]:.1f} before, {loads[-1]:.1f} "
            "after).")


def serving_engine(r: dict) -> str:
    """benchmarks/serving.py --part engine: one trace served by each configuration, each against the one before."""
    exact = ("every request's tokens equal `dantinox.generate` of it alone in every configuration"
             if r["tokens_equal_generate_alone"] else "NOT every request's tokens equal `dantinox.generate` alone")
    lines = [f"SmolLM2-135M-Instruct served by `dantinox.Engine` on {r['device']}: {r['requests']} requests sharing "
             f"a system prompt ({min(r['prompt_tokens'])}–{max(r['prompt_tokens'])} prompt tokens, seed {r['seed']}, "
             f"{r['rate']} arrivals per iteration), {r['num_pages']} pages of {r['page_size']}, at most "
             f"{r['max_seqs']} running; fastest of {r['rounds']} interleaved rounds after a compile run; "
             f"measured {r['date']} (1-minute load average {_load_range(r['load_avg_1min'])} during the run: the "
             f"machine is shared); {exact}.", "",
             "| configuration | requests/s | vs previous | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | iterations | "
             "prefix hit rate | draft acceptance | preemptions |", "|---|---|---|---|---|---|---|---|---|"]
    prev = None
    for name, c in r["configs"].items():
        ratio = "" if prev is None else f"{c['requests_per_s'] / prev:.2f}×"
        lines.append(f"| {name} | {c['requests_per_s']:.2f} | {ratio} | {c['ttft_p50_ms']:,.0f} / "
                     f"{c['ttft_p99_ms']:,.0f} | {c['tpot_p50_ms']:,.0f} / {c['tpot_p99_ms']:,.0f} | "
                     f"{c['iterations']} | {c['hit_rate']:.0%} | {c['acceptance_rate']:.0%} | {c['preemptions']} |")
        prev = c["requests_per_s"]
    m, pred = r["simulator"]["step_model"], r["simulator"]["predictions"]
    lines += ["", f"The simulator's step-time model, fitted to the continuous run's iterations: {m['call_ms']:.0f} ms "
              f"per compiled call + {m['token_ms']:.2f} ms per token it computes (padding included), plus "
              f"{m['host_ms_per_iteration']:.1f} ms of scheduling per iteration. The simulator serving the same "
              "trace, its schedule timed by that model:", "", "| configuration | simulator policy | predicted "
              "requests/s | measured | predicted / measured |", "|---|---|---|---|---|"]
    for name, p in pred.items():
        policy = "paged (in-sample: the fit's own run)" if name == "continuous batching" else "static (out-of-sample)"
        lines.append(f"| {name} | {policy} | {p['requests_per_s']:.2f} | {r['configs'][name]['requests_per_s']:.2f} | "
                     f"{p['ratio']:.2f}× |")
    return "\n".join(lines)


def serving_peer(r: dict) -> str:
    """benchmarks/serving_peer.py: one real-time trace through dantinox.Engine and transformers' continuous
    batching, each row against the peer, and the issue's target judged on this run."""
    p = r["peer"]
    cb = p["continuous_batching"]
    prompts, news = r["prompt_tokens"], r["new_tokens"]
    lines = [f"SmolLM2-135M-Instruct (float32 weights from the same GGUF file, greedy) on {r['device']}: "
             f"{r['requests']} requests sharing a system prompt ({min(prompts)}–{max(prompts)} prompt "
             f"tokens, {min(news)}–{max(news)} new tokens, seed {r['seed']}), arriving in real time at "
             f"{r['arrivals_per_s']:g} per second on average (the last at {r['arrival_span_s']:.1f} s); both "
             f"sides {r['num_pages']} pages of {r['page_size']} tokens, at most {r['max_seqs']} running, "
             f"{r['chunk_tokens']} tokens per iteration. Peer: transformers {p['transformers']} (torch "
             f"{p['torch']}, `{p['attention']}` attention, `ContinuousBatchingConfig(page_size="
             f"{cb['page_size']}, num_blocks={cb['num_blocks']}, max_requests_per_batch="
             f"{cb['max_requests_per_batch']}, max_batch_tokens={cb['max_batch_tokens']})`, prefix sharing "
             f"on). Fastest of {r['rounds']} interleaved rounds after untimed replays, measured {r['date']} "
             f"(1-minute load average {_load_range(r['load_avg_1min'])} during the run).", "",
             "| server | requests/s | vs peer | output tok/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | "
             "prefix hit rate | tokens computed / fed | calls' seconds: iterations that prefill + decode-only | "
             "compiles in timed rounds |", "|---|---|---|---|---|---|---|---|---|---|"]
    peer = r["servers"][p["name"]]

    def split(c: dict) -> str:
        return f"{c['prefill_iterations_s']:.1f} + {c['decode_iterations_s']:.1f} of {c['seconds']:.1f} s"

    for name, c in r["servers"].items():
        ratio = f"{c['requests_per_s'] / peer['requests_per_s']:.2f}×"
        lines.append(f"| {name} | {c['requests_per_s']:.2f} | {ratio} | {c['output_tokens_per_s']:.1f} | "
                     f"{c['ttft_p50_ms']:,.0f} / {c['ttft_p99_ms']:,.0f} | {c['tpot_p50_ms']:,.0f} / "
                     f"{c['tpot_p99_ms']:,.0f} | {c['hit_rate']:.0%} | "
                     f"{'' if 'computed_per_fed' not in c else format(c['computed_per_fed'], '.2f')} | "
                     f"{'' if 'computed_per_fed' not in c else split(c)} | "
                     f"{c.get('compiles_in_timed_rounds', '')} |")
    lines.append("")
    for name, c in r["servers"].items():
        if name == p["name"]:
            continue
        ratio = c["requests_per_s"] / peer["requests_per_s"]
        met = ratio >= 2 and c["ttft_p99_ms"] <= peer["ttft_p99_ms"]
        lines.append(f"- {name}: {ratio:.2f}× the peer's requests/s, p99 TTFT {c['ttft_p99_ms']:,.0f} "
                     f"against {peer['ttft_p99_ms']:,.0f} ms ({'meets' if met else 'misses'} the target: "
                     "≥ 2× at equal or better p99 TTFT).")
    lines.append(f"- Greedy tokens: {r['same_tokens_as_peer']} of {r['requests']} requests identical to the "
                 f"peer's (first token: {r['same_first_token_as_peer']} of {r['requests']}); the engine's "
                 f"two configurations {'agree' if r['engines_agree'] else 'DIFFER'} on every token.")
    return "\n".join(lines)


def lab_first_token(r: dict) -> str:
    """benchmarks/lab_first_token.py: a fresh kernel's way to the first decoded token, cold and warm cache."""
    runs = r["runs"]
    first = runs[0]
    loads = [x for run in runs for x in (run["load_avg_1min"], run["load_avg_1min_after"])]
    lines = [f"{r['lab']} on a fresh kernel, SmolLM2-135M-Instruct at batch {first['batch']} "
             f"({first['prompt_tokens']}-token prompt, {first['cache_dtype']} cache), {r['cpus']} CPU cores, "
             f"{len(runs)} run(s) taking turns, measured {r['date']} (1-minute load average "
             f"{_load_range(loads)}); "
             "seconds:", "",
             "| step | " + " | ".join(f"{run['cache']} cache" for run in runs) + " |",
             "|---|" + "---|" * len(runs)]

    def row(label: str, values: list) -> None:
        lines.append(f"| {label} | " + " | ".join("" if v is None else f"{v:,.2f}" for v in values) + " |")

    row("the set-up's warm-up (`python -m dantinox_labs.warmup`)", [run.get("warmup_s") for run in runs])
    row("kernel start", [run["kernel_start_s"] for run in runs])
    for i, label in enumerate(r["cells"]):
        row(f"code cell {i + 1}: `{label.strip()}`", [run["cells_s"][i] for run in runs])
    lines.append("| **pressing decode → first token on the panel** | "
                 + " | ".join(f"**{run['first_token_s']:,.2f}**" for run in runs) + " |")
    for key, label in (("build_model_s", "building the panel's model for the lab's cache dtype "
                                          "(`nnx.eval_shape` of the architecture, then the loaded weights)"),
                       ("trace_s", "tracing to jaxprs"), ("lower_s", "lowering to MLIR"),
                       ("compile_or_read_s", "XLA compile, or reading the program from the cache"),
                       ("cache_read_s", "of which reading from the cache")):
        row(f"  … {label}", [run[key] for run in runs])
    row("  … the rest: prefill, the first chunk's decode steps, the panel's host work",
        [run["first_token_s"] - sum(run[k] for k in ("build_model_s", "trace_s", "lower_s", "compile_or_read_s"))
         for run in runs])
    row("**the cells and the press → first token**", [run["cells_to_first_token_s"] for run in runs])
    warm = [run["first_token_s"] for run in runs if run["cache"] == "warm"]
    if warm:
        best = min(warm)
        lines += ["", f"Pressing decode to the first token with the warm cache: {best:.2f} s at best "
                  f"({'meets' if best <= r['goal_s'] else 'misses'} the ≤ {r['goal_s']:g} s goal). A second "
                  f"`dev.py lab` finds the warm-up current in {1e3 * r['stamp_check_s']:.0f} ms (the key of "
                  "the sources it was compiled from). Native kernels loaded in every run: "
                  f"{'yes' if all(run['kernels_loaded'] for run in runs) else 'NO'}; built during a run: "
                  f"{sum(run['kernels_built_during_run'] for run in runs)}."]
    return "\n".join(lines)


def smollm2_savers(r: dict) -> str:
    """benchmarks/memory_savers.py --part smollm2: bytes against quality per saver, and how the runs went."""
    lines = ["| configuration | decoded | cache B/token | perplexity | top-1 agree | mean KL |",
             "|---|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['label']} | {row['decoded']} | {row['bytes_per_token']:,.0f} | "
                     f"{row['perplexity']:.3f} | {row['agreement']:.2%} | {row['mean_kl']:.4f} |")
    for m in r["missing"]:
        lines.append(f"| {m['label']} | {m['why']} | | | | |")
    runs = r.get("runs") or []
    starts = [run["load_avg"][0] for run in runs if run.get("load_avg")]
    lines.append("")
    lines.append(f"{len(runs)} run(s) from {runs[0]['started'] if runs else r['date']}, "
                 f"{r['wall_s']:,.0f} s of wall time together"
                 + (f", 1-minute load average {_load_range(starts)} at their starts" if starts else "")
                 + (f"; not measured: {', '.join(m['label'] for m in r['missing'])}." if r["missing"] else
                    "; every configuration measured."))
    return "\n".join(lines)


def smollm2_chat(r: dict) -> str:
    """benchmarks/memory_savers.py --part smollm2-chat: the greedy answer to one long-passage question per saver."""
    lines = [f"{r['model']}, the first {r['context_tokens']:,} tokens of the held-out text and "
             f"\"{r['question']}\" ({r['prompt_tokens']:,} prompt tokens in the chat template), {r['new']} greedy "
             f"answer tokens decoded through each saver's cache; measured {r['date']} "
             f"({r['wall_s']:,.0f} s, 1-minute load average {r['load_avg'][0]:.1f} at the start):", "",
             f"| configuration | answer tokens that differ (of {r['new']}) | first that differs | the answer |",
             "|---|---|---|---|"]
    for row in r["rows"]:
        text = row["text"].replace("|", "\\|").replace("\n", " ").strip()
        first = "" if row["first_change"] is None else row["first_change"]
        lines.append(f"| {row['label']} | {row['changed']} | {first} | {text} |")
    return "\n".join(lines)


def _engine_number(quantity: str, value: float) -> str:
    return f"{value:.2f}" if quantity in ("vllm_concurrency", "llama_kv_mib", "llama_swa_mib",
                                          "llama_recurrent_mib") else f"{int(value):,}"


def engine_logs(r: dict) -> str:
    """benchmarks/engine_logs.py: published engine log lines beside the project's prediction for their settings."""
    lines = ["| engine | model | settings (from the source) | the engine printed | the project predicts | |",
             "|---|---|---|---|---|---|"]
    for row in r["rows"]:
        pred = row["predicted"]
        if row["engine"] == "vLLM" and "available_gib" in row["settings"]:  # a pool sized from printed memory
            gib = row["settings"]["available_gib"]
            low, high = sorted((row["low"], row["high"]))
            pred += (f" at {gib:.2f} GiB; {_engine_number(row['quantity'], low)}–"
                     f"{_engine_number(row['quantity'], high)} from {gib - 0.005:.3f} to {gib + 0.005:.3f} GiB")
        model = row["model"] if "config_url" not in row else f"[{row['model']}]({row['config_url']})"
        text = row["settings_text"].replace("|", "\\|")
        lines.append(f"| {row['engine']} | {model} | {text} | [`{row['line']}`]({row['url']}) | {pred} | "
                     f"{row['relation']} |")
    return "\n".join(lines)


RENDERERS = {"engine-logs": engine_logs, "decode-smollm2-135m": decode_pretrained,
             "llama-cpp-smollm2-135m": llama_cpp, "serving-engine": serving_engine,
             "decode-reference": decode_reference, "llama-cpp-smollm2-135m-context": llama_cpp_steps,
             "llama-cpp-smollm2-135m-batch": llama_cpp_steps,
             "decode-profile-smollm2-8192-bfloat16": decode_profile,
             "decode-profile-smollm2-256-bfloat16": decode_profile,
             "serving-peer": serving_peer, "serving-peer-16-per-s": serving_peer,
             "lab-first-token": lab_first_token,
             "memory_savers_smollm2": smollm2_savers,
             "memory_savers_smollm2_chat": smollm2_chat}


def render(name: str) -> str:
    return RENDERERS[name](json.loads((DATA / f"{name}.json").read_text()))


def blocks(text: str) -> dict[str, str]:
    """The marked blocks of a document: name -> the text between its markers (stripped)."""
    return {m[1]: m[2].strip() for m in re.finditer(r"<!-- table: ([\w.-]+) -->\n(.*?)<!-- end table: \1 -->",
                                                   text, re.S)}


def rewrite(text: str) -> str:
    def fill(m: re.Match) -> str:
        return f"<!-- table: {m[1]} -->\n{render(m[1])}\n<!-- end table: {m[1]} -->"

    return re.sub(r"<!-- table: ([\w.-]+) -->\n.*?<!-- end table: \1 -->", fill, text, flags=re.S)


def main() -> None:
    for doc in DOCS:
        text = doc.read_text()
        new = rewrite(text)
        if new != text:
            doc.write_text(new)
            print(f"rewrote the tables in {doc.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
