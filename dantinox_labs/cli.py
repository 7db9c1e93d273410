"""The `dantinox` command: train, generate, validate content, run a class, print the reference tables.

The composition root: each subcommand imports only the library it delegates to, so `dantinox content
check` and `dantinox classroom serve` start without JAX. Errors in what the user typed or pointed at end
in one line on stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time


def _jax_command() -> None:
    """The commands that run the model, not `import dantinox`, turn on the persistent compilation cache."""
    from dantinox import enable_compilation_cache

    enable_compilation_cache()


def _check_run_dir(run_dir: str, overwrite: bool) -> None:
    """Where the run will be written, checked before any training: never over an existing run unless asked."""
    import os
    from pathlib import Path

    path = Path(run_dir).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--run_dir: {existing} is a file; expected a folder for the new run")
    if existing == path and any(path.iterdir()) and not overwrite:
        what = "a run" if (path / "config.json").is_file() else "files"
        raise ValueError(f"--run_dir: {run_dir} already holds {what}; choose a new folder, or pass --overwrite "
                         "to replace it")
    if not os.access(existing, os.W_OK):
        raise ValueError(f"--run_dir: {existing} is not writable")


def _train(args: argparse.Namespace) -> int:
    from pathlib import Path

    if args.local_per_global is not None and args.sliding_window is None:
        raise ValueError(f"--local_per_global {args.local_per_global}: applies only with --sliding_window W")
    if args.corpus is not None and not Path(args.corpus).is_file():
        raise ValueError(f"--corpus: {args.corpus} is not a file")
    _check_run_dir(args.run_dir, args.overwrite)
    _jax_command()

    from dantinox.architectures.config import ModelConfig
    from dantinox.architectures.windows import local_layers
    from dantinox.train import train

    if args.corpus is None:
        import content

        text = content.corpus_text()
    else:
        text = Path(args.corpus).read_text(encoding="utf-8")
    train(args.run_dir, corpus=text, preset=args.preset, steps=args.steps, paradigm=args.paradigm,
          seed=args.seed, batch_size=args.batch_size, seq_len=args.seq_len,
          **({} if args.sliding_window is None else dict(sliding_windows=local_layers(
              ModelConfig.preset(args.preset).n_layers, args.sliding_window, args.local_per_global))))
    print(f"wrote {args.run_dir}")
    return 0


def _generate(args: argparse.Namespace) -> int:
    _jax_command()
    if args.model is not None:
        return _generate_pretrained(args)
    from dantinox.rundir import Generator

    if args.chat:
        raise ValueError("--chat: needs a --model with a chat template; run directories hold byte-level models")
    gen = Generator(args.run_dir)
    diffusion_only = {"--cache": args.cache_mode, "--block_size": args.block_size, "--threshold": args.threshold}
    if gen.cfg.paradigm != "diffusion":
        given = [flag for flag, value in diffusion_only.items() if value is not None]
        if given:
            print(f"dantinox generate: error: {given[0]} applies to diffusion runs; {args.run_dir} holds a model with "
                  f"paradigm={gen.cfg.paradigm!r}", file=sys.stderr)
            return 2
    opts = dict(use_cache=not args.no_cache, temperature=args.temperature, seed=args.seed,
                block_size=32 if args.block_size is None else args.block_size,
                threshold=0.9 if args.threshold is None else args.threshold,
                cache_mode="dual" if args.cache_mode is None else args.cache_mode)
    start = time.perf_counter()
    gen.generate(args.prompt, max_new_tokens=args.max_new_tokens, **opts)  # compiles what this request needs
    compile_and_run = time.perf_counter() - start
    start = time.perf_counter()
    text = gen.generate(args.prompt, max_new_tokens=args.max_new_tokens, **opts)
    seconds = time.perf_counter() - start
    print(args.prompt + text)
    if gen.cfg.paradigm == "diffusion":
        mode = f"diffusion, cache={'none' if args.no_cache else opts['cache_mode']}, {gen.last_nfe} model evaluations"
    else:
        mode = "no cache" if args.no_cache else "KV cache"
    print(f"[{args.max_new_tokens} tokens in {seconds:.2f} s: {args.max_new_tokens / seconds:.1f} tokens/s, "
          f"{mode}; the first, compiling run took {compile_and_run:.2f} s]", file=sys.stderr)
    return 0


def _generate_pretrained(args: argparse.Namespace) -> int:
    from dantinox.architectures.pretrained import PretrainedGenerator

    gen = PretrainedGenerator(args.model)
    opts = dict(max_new_tokens=args.max_new_tokens, use_cache=not args.no_cache, temperature=args.temperature,
                seed=args.seed, chat=args.chat)
    start = time.perf_counter()
    gen.generate(args.prompt, **opts)  # compiles what this request needs
    compile_and_run, start = time.perf_counter() - start, time.perf_counter()
    text = gen.generate(args.prompt, **opts)
    seconds = time.perf_counter() - start
    print(text if args.chat else args.prompt + text)
    print(f"[{args.max_new_tokens} tokens in {seconds:.2f} s: {args.max_new_tokens / seconds:.1f} tokens/s, "
          f"{'no cache' if args.no_cache else 'KV cache'}; the first, compiling run took {compile_and_run:.2f} s]",
          file=sys.stderr)
    return 0


def _models(args: argparse.Namespace) -> int:
    from dantinox.accounting.memory import format_bytes
    from dantinox.architectures.pretrained import list_models

    for row in list_models():
        size = "not installed (python3 dev.py setup)" if row["size"] is None else format_bytes(row["size"])
        print(f"{row['name']}\t{row['source']}\t{size}\t{row['license']}\t{row['about']}")
    return 0


def _kv(args: argparse.Namespace) -> int:
    """`dantinox kv`: the per-layer KV-cache ledger of a published model or the user's config.json / GGUF."""
    if args.list:
        if args.config is not None:
            raise ValueError("--list: lists the catalogue; give either --list or a CONFIG, not both")
        from dantinox.architectures.catalogue import catalogue

        for name, entry in catalogue().items():
            print(f"{name}\t{entry['title']}\t{entry['config_url']}")
        return 0
    if args.config is None:
        raise ValueError("CONFIG: expected a catalogue name (dantinox kv --list), a config.json path or a .gguf path")
    if args.tokens is None:
        raise ValueError("--tokens: required with a CONFIG (the context T to size the cache for)")
    import json

    from dantinox.accounting.kv_ledger import kv_ledger, with_working_model
    from dantinox.architectures.catalogue import load_architecture
    from dantinox_labs.kv_table import ledger_table

    arch = load_architecture(args.config)
    ledger = kv_ledger(arch, args.tokens, args.batch, args.cache_dtype, args.device, args.weight_bytes,
                       measure=not args.measure, weights_format=args.weights_format, mtp=args.mtp)
    arch = arch.with_mtp_layers() if args.mtp else arch  # the layers the ledger counted
    if args.measure:
        ledger = with_working_model(ledger, arch)
    print(json.dumps(ledger.to_json()) if args.json else ledger_table(ledger, arch))
    return 0


def _content_check(args: argparse.Namespace) -> int:
    from content import CONTENT_DIR
    from content.check import run

    return run(args.paths or [str(CONTENT_DIR)])


def _tables(args: argparse.Namespace) -> int:
    _jax_command()
    from dantinox.accounting.memory import reference_tables

    print(reference_tables())
    return 0


def _lab(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    from dantinox_labs import workspace

    folder = workspace.labs_folder() if args.dir is None else Path(args.dir)
    for change in workspace.prepare(folder):
        print(f"dantinox lab: {change}", flush=True)
    if args.prepare_only:
        print(folder)
        return 0
    argv, env = workspace.lab_command(folder, args.jupyter_args)
    print(f"dantinox lab: opening your copy of the labs in {folder}", flush=True)
    os.execve(argv[0], argv, env)  # JupyterLab replaces this process: Ctrl+C stops it as usual


def _classroom_serve(args: argparse.Namespace) -> int:
    from classroom.service import serve

    serve(db=args.db, port=args.port, ip=args.ip, hub_pid=args.hub_pid)
    return 0


def _answers_export(args: argparse.Namespace) -> int:
    from classroom.cli import answers_export

    return answers_export(args)


def _classroom_nbgrader(args: argparse.Namespace) -> int:
    from classroom.cli import nbgrader

    if args.exercises is None:
        return nbgrader(args)
    from dantinox_labs.exercise_assignment import write_exercises

    try:
        path = write_exercises(args.out, args.exercises, points=args.points)
    except ValueError as err:
        print(f"dantinox classroom nbgrader: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return nbgrader(args) if args.entries else 0


class _WithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each option's default, except where there is none (the help then says what happens)."""

    def _get_help_string(self, action):
        return action.help if action.default is None or action.default is False else super()._get_help_string(action)


def build_parser(presets: list[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser; `presets` (the model presets' names) only for `train`, whose help lists them."""
    p = argparse.ArgumentParser(prog="dantinox", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a small model and write a run directory",
                       formatter_class=_WithDefaults)
    t.add_argument("--run_dir", required=True, help="a new folder for the run (an existing run needs --overwrite)")
    t.add_argument("--overwrite", action="store_true", help="replace the run already in --run_dir")
    t.add_argument("--preset", default="tiny", help="model size: " + ", ".join(presets or ["see dantinox.PRESETS"]))
    t.add_argument("--steps", type=int, default=600, help="optimizer steps")
    t.add_argument("--paradigm", choices=["autoregressive", "diffusion"], default="autoregressive",
                   help="next-token or masked-diffusion training")
    t.add_argument("--corpus", default=None, help="a UTF-8 text file (default: the prose of the concept entries)")
    t.add_argument("--batch_size", type=int, default=16, help="sequences per step")
    t.add_argument("--seq_len", type=int, default=128, help="tokens per training sequence")
    t.add_argument("--seed", type=int, default=0, help="initialisation and data-order seed")
    t.add_argument("--sliding_window", type=int, default=None, help="W: train local layers (default: full attention)")
    t.add_argument("--local_per_global", type=int, default=None,
                   help="with --sliding_window: n local layers before each global one, e.g. 1 (Gemma 2) or 5 "
                        "(Gemma 3); default: every layer local")
    t.set_defaults(func=_train)

    g = sub.add_parser("generate", help="continue a prompt with a trained run directory or a published model")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--run_dir")
    src.add_argument("--model", help="a name from `dantinox models`, a llama .gguf file or a Hugging Face folder")
    g.add_argument("--chat", action="store_true", help="--model only: the prompt is a user message (chat template)")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max_new_tokens", type=int, default=100)
    g.add_argument("--no_cache", action="store_true", help="recompute every token (to see what the cache saves)")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--cache", dest="cache_mode", choices=["none", "prefix", "dual"], default=None,
                   help="diffusion runs only (default dual)")
    g.add_argument("--block_size", type=int, default=None, help="diffusion runs only (default 32)")
    g.add_argument("--threshold", type=float, default=None, help="diffusion runs only: confidence to unmask (0.9)")
    g.set_defaults(func=_generate)

    c = sub.add_parser("content", help="concept entries")
    csub = c.add_subparsers(dest="content_command", required=True)
    cc = csub.add_parser("check", help="validate YAML concept entries (default: content/entries/)")
    cc.add_argument("paths", nargs="*")
    cc.set_defaults(func=_content_check)

    cl = sub.add_parser("classroom", help="classroom sessions on JupyterHub")
    classroom_sub = cl.add_subparsers(dest="classroom_command", required=True)
    cs = classroom_sub.add_parser("serve", help="run the classroom service (started by JupyterHub, see "
                                                "classroom/jupyterhub_config.py)")
    cs.add_argument("--db", default=None, help="SQLite file (default: $DANTINOX_CLASSROOM_DB, else the data dir)")
    cs.add_argument("--port", type=int, default=None, help="default: the port in $JUPYTERHUB_SERVICE_URL")
    cs.add_argument("--ip", default="127.0.0.1")
    cs.add_argument("--hub-pid", type=int, default=None, help="stop when this process (the hub that started the "
                                                               "service, its parent) is gone")
    cs.set_defaults(func=_classroom_serve)
    cn = classroom_sub.add_parser("nbgrader", help="write an nbgrader source assignment from entries' checks "
                                                   "and/or the exercises")
    cn.add_argument("entries", nargs="*", metavar="ENTRY", help="entry ids, e.g. kv-cache")
    cn.add_argument("--exercises", nargs="*", metavar="ID", default=None,
                    help="also (or only) the exercises of labs/exercises.ipynb as exercises.ipynb, hidden tests on "
                         "other random cases; no ids: all of them")
    cn.add_argument("--out", required=True, help="the assignment's source folder, e.g. course/source/kv")
    cn.add_argument("--points", type=float, default=1.0, help="points per check or exercise (default 1)")
    cn.set_defaults(func=_classroom_nbgrader)

    an = sub.add_parser("answers", help="your own quiz answers, from the local answer store")
    asub = an.add_subparsers(dest="answers_command", required=True)
    ae = asub.add_parser("export", help="write your attempts as CSV or JSON")
    ae.add_argument("--format", choices=["csv", "json"], default="json")
    ae.add_argument("--out", default=None, help="a file to write (default: standard output)")
    ae.add_argument("--learner", default=None, help="default: $JUPYTERHUB_USER, else your OS user name")
    ae.add_argument("--entry", default=None, help="only this entry id")
    ae.add_argument("--db", default=None, help="the answer store (default: $DANTINOX_ANSWERS_DB, else the data dir)")
    ae.set_defaults(func=_answers_export)

    md = sub.add_parser("models", help="list the published models that load here (name, source, size, license)")
    md.set_defaults(func=_models)

    lb = sub.add_parser("lab", allow_abbrev=False,
                        help="open your own copy of the labs in JupyterLab (copied from the shipped labs)",
                        description="Copies the shipped labs into your working folder where they are missing or a "
                                    "newer version shipped (your edited copy is kept under earlier/), then starts "
                                    "JupyterLab there. Other options go to JupyterLab, e.g. --port=8890.")
    lb.add_argument("--dir", default=None, help="the working folder (default: $DANTINOX_LABS_DIR, else labs/ in "
                                                "your user data directory)")
    lb.add_argument("--prepare-only", action="store_true", help="update the working folder, print it, and stop")
    lb.set_defaults(func=_lab, takes_extra=True)

    kv = sub.add_parser("kv", help="the KV cache of a published model, layer by layer, and its fit on a device",
                        formatter_class=_WithDefaults)
    kv.add_argument("config", nargs="?", default=None, metavar="CONFIG",
                    help="a catalogue name (see --list), a Hugging Face config.json path or a .gguf path")
    kv.add_argument("--list", action="store_true", help="list the catalogue of published models")
    kv.add_argument("--tokens", type=int, default=None, help="T: tokens each sequence holds")
    kv.add_argument("--batch", type=int, default=1, help="B: sequences")
    kv.add_argument("--cache-dtype", dest="cache_dtype", default="bfloat16",
                    help="float32, bfloat16, float16, or int8 / fp8_e4m3 codes with float32 scales")
    kv.add_argument("--device", default=None, help='a device preset for the fit, e.g. "H100 80GB"')
    kv.add_argument("--weight-bytes", dest="weight_bytes", type=int, default=None,
                    help="the weights' bytes for the fit (default: the catalogue's parameters in --weights-format, "
                         "or a GGUF's tensor bytes)")
    kv.add_argument("--weights-format", dest="weights_format", default=None,
                    help="how the weights are stored, for the fit: fp32, bf16, fp8 or mxfp4 (default: the published "
                         "checkpoint's format where the catalogue names it, else bf16)")
    kv.add_argument("--json", action="store_true", help="print the ledger as JSON")
    kv.add_argument("--mtp", action="store_true",
                    help="count the model's multi-token-prediction layers (num_nextn_predict_layers) as an engine "
                         "drafting with them caches them (vLLM's deepseek_mtp); plain decoding caches none")
    kv.add_argument("--measure", action="store_true",
                    help="build a working model with the real per-layer cache geometry (narrow widths, random "
                         "weights), decode with it and print each layer's measured bytes beside the ledger")
    kv.set_defaults(func=_kv)

    tb = sub.add_parser("tables", help="print the KV-cache reference tables (generated from the formula)")
    tb.set_defaults(func=_tables)
    return p


def _preset_names() -> list[str]:
    from dantinox.architectures.config import PRESETS  # imports JAX: only for the command that trains anyway

    return sorted(PRESETS)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(_preset_names() if words[:1] == ["train"] else None)
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.jupyter_args = extra
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:  # bad input: one line, exit status 2 as for a usage error
        print(f"dantinox {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
