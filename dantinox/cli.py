"""The `dantinox` command: train, generate, validate content, print the reference tables.

Errors in what the user typed or pointed at end in one line on stderr and a non-zero exit, never a
traceback.
"""

from __future__ import annotations

import argparse
import sys
import time


def content_corpus() -> str:
    """The prose of the concept entries in content/entries/, loaded by the strict content loader."""
    import content

    texts: list[str] = []

    def collect(node) -> None:
        if isinstance(node, str):
            if len(node) > 20 and not node.startswith("http"):
                texts.append(" ".join(node.split()))
        elif isinstance(node, dict):
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    for entry in content.load_all().values():
        collect(entry.model_dump())
    if not texts:
        raise ValueError(f"corpus: no text found in {content.CONTENT_DIR}; pass --corpus FILE")
    return "\n".join(texts)


def _train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dantinox.train import train

    if args.corpus is None:
        text = content_corpus()
    elif not Path(args.corpus).is_file():
        raise ValueError(f"--corpus: {args.corpus} is not a file")
    else:
        text = Path(args.corpus).read_text(encoding="utf-8")
    train(args.run_dir, corpus=text, preset=args.preset, steps=args.steps, paradigm=args.paradigm,
          seed=args.seed, batch_size=args.batch_size, seq_len=args.seq_len,
          **({} if args.sliding_window is None else dict(sliding_window=args.sliding_window,
                                                          window_pattern=args.window_pattern)))
    print(f"wrote {args.run_dir}")
    return 0


def _generate(args: argparse.Namespace) -> int:
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
    from dantinox.pretrained import PretrainedGenerator

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
    from dantinox.memory import format_bytes
    from dantinox.pretrained import list_models

    for row in list_models():
        size = "not installed (python3 dev.py setup)" if row["size"] is None else format_bytes(row["size"])
        print(f"{row['name']}\t{row['source']}\t{size}\t{row['license']}\t{row['about']}")
    return 0


def _content_check(args: argparse.Namespace) -> int:
    from content import CONTENT_DIR
    from content.check import run

    return run(args.paths or [str(CONTENT_DIR)])


def _tables(args: argparse.Namespace) -> int:
    from dantinox.memory import reference_tables

    print(reference_tables())
    return 0


def _classroom_serve(args: argparse.Namespace) -> int:
    from classroom.service import serve

    serve(db=args.db, port=args.port, ip=args.ip)
    return 0


def _answers_export(args: argparse.Namespace) -> int:
    from classroom.cli import answers_export

    return answers_export(args)


def _classroom_nbgrader(args: argparse.Namespace) -> int:
    from classroom.cli import nbgrader

    return nbgrader(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dantinox", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a small model and write a run directory")
    t.add_argument("--run_dir", required=True)
    t.add_argument("--preset", default="tiny")
    t.add_argument("--steps", type=int, default=600)
    t.add_argument("--paradigm", choices=["autoregressive", "diffusion"], default="autoregressive")
    t.add_argument("--corpus", default=None, help="a UTF-8 text file (default: the text of content/entries/*.yaml)")
    t.add_argument("--batch_size", type=int, default=16)
    t.add_argument("--seq_len", type=int, default=128)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--sliding_window", type=int, default=None, help="W: train local layers (default: none)")
    t.add_argument("--window_pattern", default="local", help="'local' or 'n:1' local:global, e.g. 1:1 (Gemma 2)")
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
    cs.set_defaults(func=_classroom_serve)
    cn = classroom_sub.add_parser("nbgrader", help="write an nbgrader source assignment from entries' checks")
    cn.add_argument("entries", nargs="+", metavar="ENTRY", help="entry ids, e.g. kv-cache")
    cn.add_argument("--out", required=True, help="the assignment's source folder, e.g. course/source/kv")
    cn.add_argument("--points", type=float, default=1.0, help="points per check (default 1)")
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

    tb = sub.add_parser("tables", help="print the KV-cache reference tables (generated from the formula)")
    tb.set_defaults(func=_tables)
    return p


def main(argv: list[str] | None = None) -> int:
    from dantinox._jax_setup import enable_compilation_cache

    args = build_parser().parse_args(argv)
    enable_compilation_cache()  # the command, not `import dantinox`, turns the persistent cache on
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:  # bad input: one line, exit status 1
        print(f"dantinox {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
