"""The `specedge` command: each subcommand parses its flags and calls the library.

The flags several commands share, and what they load, are in options.py. Each command imports the
library it runs inside itself, so `specedge --help` and a mistyped flag load no more than the parser.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from specedge import __version__
from specedge.core.errors import DamagedArtifactError, SpecEdgeError
from specedge.models.locks import is_disk_full
from specedge.models.registry import DEFAULT_PAIR, HUB_PAIRS, MODELS, PAIRS, get_pair
from specedge.options import (
    add_context_flag,
    add_gamma_flags,
    add_pair_flags,
    add_provider_flags,
    add_sampling_flags,
    add_template_flags,
    artifact_arg,
    build_config,
    default_pair,
    fraction,
    load_generator,
    nonnegative_float,
    nonnegative_int,
    pair_paths,
    parse_widths,
    penalty_arg,
    positive_float,
    positive_int,
    probability_mass,
)
from specedge.serve.command import add_serve_parser

DEFAULT_QUANT = {"cpu": "int4", "qnn": "int4", "dml": "fp32"}


def cmd_export(args: argparse.Namespace) -> int:
    try:
        from specedge.export.artifact import export_model
    except ImportError as e:
        raise SpecEdgeError(f"export needs packages this installation lacks ({e.name})",
                            "pip install 'specedge[export]'") from None
    from specedge.export.settings import ROWS_BLOCKS, ExportSettings, int4_kernel_here, int8_weights_here

    quant = args.quant or DEFAULT_QUANT[args.target_provider]
    if (args.soc or args.contexts) and args.target_provider != "qnn":
        raise SpecEdgeError("--soc and --contexts are for QNN exports", "add --for qnn, or drop them")
    if args.soc:
        from specedge.runtime.qnn import resolve_soc

        resolve_soc(args.soc)  # an unknown SoC stops the export before it starts
    settings = ExportSettings(quant=quant, context=args.context, widths=args.widths, target=args.target_provider,
                              fp16=args.fp16, block_size=args.block_size, attention=args.attention,
                              head_vocab=args.head_vocab, int8_weights=int8_weights_here(quant, args.target_provider),
                              int4_kernel=args.int4_kernel or ("nbits" if args.block_size not in ROWS_BLOCKS
                                                               else int4_kernel_here(quant, args.target_provider)))
    result = export_model(Path(args.model), Path(args.out), settings, overwrite=args.force)
    m = result.manifest
    print(f"exported {m.architecture} ({m.num_layers} layers, {m.quantization.method}) to {result.path}")
    print(f"time {result.seconds:.1f} s, peak memory {result.peak_rss_bytes / 2**30:.2f} GiB")
    if args.target_provider == "qnn" and (args.soc or args.contexts):
        from specedge.export.qnn_context import write_qnn_target

        for line in write_qnn_target(result.path, args.soc, args.contexts):
            print(line)
    return 0


def grammar_arg(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The grammar --json-schema FILE, --json, --regex or --grammar FILE asks the output to follow."""
    from specedge.runtime.constraints.grammar import Grammar

    if args.json_schema is not None:
        return Grammar("json_schema", read_text_arg(args.json_schema, "--json-schema"))
    if args.json_object:
        return Grammar("json_object")
    if args.regex is not None:
        return Grammar("regex", args.regex)
    if args.grammar is not None:
        syntax = "gbnf" if args.grammar.endswith(".gbnf") else "lark"
        return Grammar(syntax, read_text_arg(args.grammar, "--grammar"))
    return None


def read_text_arg(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecEdgeError(f"{flag} {path} cannot be read ({e})", f"pass a UTF-8 text file to {flag}") from None


def prompt_arg(args: argparse.Namespace) -> str:
    """The prompt: -p TEXT, -p - (standard input) or -f FILE."""
    if args.file is not None:
        return read_text_arg(args.file, "--file")
    if args.prompt is None:
        raise SpecEdgeError("generate needs a prompt", "pass -p TEXT, -p - to read standard input, or -f FILE")
    if args.prompt == "-":
        try:
            return sys.stdin.read()
        except UnicodeDecodeError as e:
            raise SpecEdgeError(f"standard input is not UTF-8 text ({e})", "pipe UTF-8 text to -p -") from None
    return str(args.prompt)


def cmd_generate(args: argparse.Namespace) -> int:
    from specedge.chat import stats_line
    from specedge.runtime.text.template.sandbox import ChatTemplateError

    if args.suffix and args.chat:
        raise SpecEdgeError("--suffix fills in the middle of a raw prompt, not a chat", "drop --chat or --suffix")
    text = prompt_arg(args)
    if args.draft is not None and args.target is None:
        raise SpecEdgeError("--draft needs --target", "pass -m TARGET with --draft, or neither for the default pair")
    if args.target is None:  # the default pair, decoded the way measured fastest here (as chat)
        way = default_pair(args.pair, None, None, "0" if args.no_draft else args.gamma, args.ngram, args.context)
        target, draft, ngram = way.target, None if args.no_draft else way.draft, way.ngram and not args.no_draft
        no_draft = args.no_draft or way.single_steps
    else:
        target = artifact_arg(args.target, args.context)
        draft = None if args.no_draft or args.draft is None else artifact_arg(args.draft, args.context)
        ngram, no_draft = args.ngram and not args.no_draft, args.no_draft
    from specedge.request import model_sampling

    config = build_config(args, no_draft=no_draft, stop=args.stop, ignore_eos=args.ignore_eos,
                          model=model_sampling(target))
    gen = load_generator(args, target, draft, ngram, config)
    from specedge.request import Defaults, Request, config_fields, encode, shape

    # the prompt (a chat of one message, or raw text; with --suffix, the text before the gap) as a request
    ask = Request(messages=({"role": "user", "content": text},) if args.chat else (), prompt=text,
                  suffix=args.suffix or None, grammar=grammar_arg(args))
    try:
        form = shape(ask)
        stream = gen.stream(encode(gen, ask, args.target or args.pair), grammar=form.grammar,
                            **config_fields(ask, Defaults.of(gen.config)))
        for piece in stream:
            if not args.json:
                print(piece, end="", flush=True)
    except ChatTemplateError as e:
        raise e.advise("drop --chat and pass the raw prompt") from None
    result = stream.result
    assert result is not None
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print("\n" + stats_line(result.stats), file=sys.stderr)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from specedge.models.paths import cache_root
    from specedge.storage import cached_items, export_sizes, gigabytes, when

    items = cached_items()
    print("models:")
    for entry in MODELS.values():
        mine = [item for item in items if item.model == entry.name]
        weights = [item for item in mine if item.kind == "weights"]
        mine_exports = [item for item in mine if item.kind == "export"]
        exports = export_sizes(mine_exports)
        state = (["weights cached"] if weights else []) + ([f"exports: {', '.join(exports)}"] if exports else [])
        if mine_exports:
            state.append(f"last used {when(max(item.used for item in mine_exports))}")
        print(f"  {entry.name:<22} {entry.size / 1e9:5.2f} GB  {entry.description}")
        print(f"  {'':<22} {'; '.join(state) or 'not fetched'}; {entry.license}")
        if entry.generation:  # the model card's sampling defaults: what the server gives a request setting none
            print(f"  {'':<22} sampling defaults: " + ", ".join(f"{k} {v:g}" for k, v in entry.generation))
    print("pairs:")
    for pair in PAIRS.values():
        mark = " (default)" if pair.name == DEFAULT_PAIR else ""
        print(f"  {pair.name:<22} target {pair.target}, draft {pair.draft}, γ auto{mark}")
    print("pairs on the Hugging Face Hub (fetched online on first use, into its cache):")
    for pair in HUB_PAIRS.values():
        print(f"  {pair.name:<22} target {pair.target}, draft {pair.draft}")
    others = [item for item in items if item.kind == "export" and not item.model]
    if others:
        print("other exports (GGUF files, checkpoints, hf: names):")
        for item in sorted(others, key=lambda i: -i.used):
            print(f"  {item.path.name:<60} {gigabytes(item.size)}, last used {when(item.used)}")
    total = sum(item.size for item in items)
    print(f"cache: {gigabytes(total)} in {cache_root()} (`specedge prune` frees the exports the default "
          "decoding does not use; `specedge rm NAME` a model's)")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from specedge.storage import gigabytes, named, remove

    items = [item for item in named(args.name) if args.weights or item.kind != "weights"]
    if not items:
        print(f"nothing of {args.name} is cached" + ("" if args.weights else " (exports; --weights: its weights too)"))
        return 0
    freed = remove(items, dry_run=args.dry_run)
    print(f"{'would free' if args.dry_run else 'freed'} {gigabytes(freed)}")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    from specedge.storage import cached_items, dead_scratch, gigabytes, remove, used_by_default

    used = used_by_default()
    unused = [item for item in cached_items() if item.kind == "export" and item.path.resolve() not in used]
    unused += dead_scratch()
    if not unused:
        print("every cached export is one the default decoding uses")
        return 0
    freed = remove(unused, dry_run=args.dry_run)
    print(f"{'would free' if args.dry_run else 'freed'} {gigabytes(freed)}; the weights are kept (`specedge rm NAME "
          "--weights` removes a model's)")
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from specedge.models.fetch import fetch

    given, _, quant = args.name.partition(":")
    if quant and given in PAIRS:
        raise SpecEdgeError(f"'{args.name}': a pair takes no :QUANT", "name one of its models as NAME:QUANT")
    if given in HUB_PAIRS:  # a Hugging Face pair: into the Hub's cache
        from specedge.hub import hub_source

        for name in (HUB_PAIRS[given].target, HUB_PAIRS[given].draft):
            print(f"{name}: {hub_source(name)}")
        return 0
    names = [get_pair(given).target, get_pair(given).draft] if given in PAIRS else [given]
    for name in names:
        weights = fetch(name)
        print(f"{name}: {weights}")
        if args.reexport:
            from specedge.rebuild import reexport

            for out in reexport(name, quant or None, weights):
                print(f"{name}: exported again to {out}")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from specedge.chat import HELP, ChatSession, terminal_lines

    way = default_pair(args.pair, args.target, args.draft, args.gamma, args.ngram, args.context)
    from specedge.request import model_sampling

    config = build_config(args, no_draft=way.single_steps, model=model_sampling(way.target))
    gen = load_generator(args, way.target, way.draft, way.ngram, config, way.single_steps)
    session = ChatSession(gen, system=args.system, max_new_tokens=args.max_new_tokens,
                          show_draft=args.show_draft)
    if args.prompt is not None:
        session.ask(args.prompt)  # an error ends the command, as `generate`'s does
    elif sys.stdin.isatty():
        print(f"specedge chat: {way.target.name}" + (f" + {Path(way.draft).name}" if way.draft else "") + f". {HELP}")
        session.run(terminal_lines())
    else:
        session.run(sys.stdin)
    return 0


def cmd_profile_measure(args: argparse.Namespace) -> int:
    from specedge.choose import verdict
    from specedge.defaults import default_choice
    from specedge.profiling import THIS_DEVICE, measure_device, profile_path

    profile_path(args.name)  # a name that is no plain file name stops before anything is exported or measured
    target = artifact_arg(args.target) if args.target else None
    draft = artifact_arg(args.draft) if args.draft else None
    profile, path = measure_device(target, draft, name=args.name)
    print(f"memory bandwidth (read): {profile.memory_bandwidth_gb_per_s.value:.1f} GB/s")
    for lat in profile.latencies:
        widths = ", ".join(f"S={w}: {t * 1000:.1f} ms" for w, t in sorted(lat.seconds.items()))
        print(f"t(S) {lat.artifact}: {widths}")
    for pair, alpha in profile.acceptance.items():
        print(f"acceptance {pair}: {alpha:.2f}")
    for model in profile.choices if args.name == THIS_DEVICE else ():  # the defaults chosen here: again
        choice = default_choice(model, remeasure=True)
        if choice is not None:
            print(f"default for {model} here: {verdict(choice)}")
    print(f"wrote {path}")
    return 0


def cmd_profile_predict(args: argparse.Namespace) -> int:
    from specedge.profiling import bandwidth_bound, device_profile, plot_prediction, predict_pair, prediction_json

    device = device_profile(args.device)
    target, draft = artifact_arg(args.target), artifact_arg(args.draft)
    prediction = predict_pair(device, target, draft, args.acceptance)
    if args.json:
        print(prediction_json(device, prediction))
    else:
        print(f"{device.name}: {device.description}")
        print(f"plain decoding: {prediction.plain_tokens_per_s:.1f} tokens/s (α = {prediction.alpha:.2f})")
        print("| γ | tokens/round | tokens/s | speedup |\n|---|---|---|---|")
        for p in prediction.points:
            print(f"| {p.gamma} | {p.expected_tokens:.2f} | {p.tokens_per_s:.1f} | {p.speedup:.2f}× |")
        rec = prediction.recommended_gamma
        print(f"recommended γ: {rec}" + (" (plain decoding: no γ beats it)" if rec == 0 else ""))
    if args.plot:
        plot_prediction(device, prediction, Path(args.plot), bandwidth_bound(device, target))
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def cmd_profile_steps(args: argparse.Namespace) -> int:
    import json

    from specedge.options import pair_paths
    from specedge.step_profile import profile_steps, ratio_lines, report

    target, draft = pair_paths(args.pair, args.target, args.draft)
    models = [("target", target), *([("draft", draft)] if draft is not None else [])]
    widths = {"target": args.widths, "draft": (1,)}  # a draft runs 1-token steps only
    profiles, bandwidth, times = profile_steps(models, widths, args.contexts, args.repeats, args.threads)
    print(f"read bandwidth here: {bandwidth:.1f} GB/s (a working set larger than the last-level cache)")
    for profile in profiles:
        print()
        for line in report(profile, bandwidth):
            print(line)
    for folder, folder_times in times.items():
        print()
        for line in ratio_lines(folder, folder_times):
            print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "bandwidth_gb_per_s": bandwidth, "passes": [p.to_dict() for p in profiles],
            "interleaved_ms": {str(f): {f"{r}x{c}": ms for (r, c), ms in t.items()} for f, t in times.items()}},
            indent=2))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def add_profile(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="measure this device, or predict tokens/s and γ for a device profile")
    psub = p.add_subparsers(dest="profile_command", required=True, metavar="ACTION")
    m = psub.add_parser("measure", help="measure bandwidth, t(S) and acceptance here, choose the default "
                                        "exports again; write a device profile")
    m.add_argument("--target", help="target artifact folder or registry model")
    m.add_argument("--draft", help="draft artifact folder or registry model")
    m.add_argument("--name", default="this-device",
                   help="profile name: letters, digits, '-', '_', '.' (default this-device)")
    m.set_defaults(func=cmd_profile_measure)
    q = psub.add_parser("predict", help="tokens/s of plain and speculative decoding at each γ on a device")
    q.add_argument("--device", required=True, help="a device profile name, e.g. snapdragon-x-elite")
    q.add_argument("--target", required=True)
    q.add_argument("--draft", required=True)
    q.add_argument("--acceptance", type=float, default=None, help="α; default: the device's measured one")
    q.add_argument("--json", action="store_true")
    q.add_argument("--plot", default=None, help="write a PNG of tokens/s against γ")
    q.set_defaults(func=cmd_profile_predict)
    s = psub.add_parser("steps", help="where the time of one pass goes (target and draft, 1 row and the verification "
                                      "width, short and long context): ms, %%, bytes and rate per kind of node")
    add_pair_flags(s)
    s.add_argument("--widths", type=parse_widths, default=(1, 5), help="target pass widths (default 1,5)")
    s.add_argument("--contexts", type=parse_widths, default=(16, 2048),
                   help="cached tokens before the pass (default 16,2048)")
    s.add_argument("--repeats", type=positive_int, default=10, help="timed passes each (default 10)")
    s.add_argument("--threads", type=positive_int, default=None, help="onnxruntime threads per model")
    s.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")
    s.set_defaults(func=cmd_profile_steps)


def cmd_bench(args: argparse.Namespace) -> int:
    from specedge.bench import SAMPLING_MATRIX, BenchOptions, run_bench
    from specedge.kernels.penalties import Penalties
    from specedge.kernels.sampling import SamplingParams

    target, draft = pair_paths(args.pair, args.target, args.draft)
    if draft is None:
        raise SpecEdgeError("bench compares speculation with plain decoding: it needs a draft", "pass --draft")
    only = args.modes.split(",") if args.modes else None
    default = None
    if only and "default" in only:  # decode as chat does here, and say how
        from specedge.defaults import pair_decoding

        default = pair_decoding(args.pair)
        print(f"specedge bench: mode 'default': {default.line}", file=sys.stderr)
    penalties = Penalties(presence=args.presence_penalty, frequency=args.frequency_penalty,
                          repetition=args.repetition_penalty)
    settings = SAMPLING_MATRIX if args.sampling_matrix else (
        SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                       penalties=penalties),)
    options = BenchOptions(max_new_tokens=args.max_new_tokens, gammas=tuple(int(g) for g in args.gammas.split(",")),
                           limit=args.limit, command="specedge " + " ".join(sys.argv[1:]), only=only,
                           baseline_dir=artifact_arg(args.baseline) if args.baseline else None, default=default,
                           settings=settings, seed=args.seed,
                           rules=(args.acceptance,) if args.acceptance else ("race", "rejection"), rounds=args.rounds)
    report = run_bench(target, draft, Path(args.prompts), Path(args.out), options)
    print(report.read_text())
    return 0


def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="plain vs speculative decoding per prompt kind, the modes taking turns")
    p.add_argument("--prompts", required=True, help="JSONL file: one {kind, prompt} per line")
    p.add_argument("--out", required=True, help="folder for results.json, results.md, speedup.png")
    add_pair_flags(p)
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--gammas", default="1,2,3,4,5,6,7,8", help="fixed γ values to run the draft model at")
    p.add_argument("--limit", type=positive_int, default=None, help="only the first N prompts")
    p.add_argument("--rounds", type=positive_int, default=2,
                   help="passes over the prompts, the modes taking turns prompt by prompt (default 2)")
    p.add_argument("--modes", default=None, help="only these modes besides plain, e.g. draft-auto,ngram; 'default': "
                                                 "decode as `specedge chat` does on this machine (the --pair's choice)")
    p.add_argument("--baseline", default=None,
                   help="another export of the target (folder or NAME:QUANT, e.g. qwen2.5-coder-1.5b:int4) whose "
                        "plain decoding runs too, as the speed to beat")
    p.add_argument("--temperature", type=nonnegative_float, default=0.0,
                   help="sample at this temperature (default 0: greedy); each speculative mode then runs under both "
                        "acceptance rules: MODE by the race (tokens of plain sampling with --seed), MODE-rejection by "
                        "min(1, p/q)")
    p.add_argument("--top-k", type=nonnegative_int, default=0, help="keep the k likeliest tokens when sampling "
                                                                    "(default 0: all)")
    p.add_argument("--top-p", type=probability_mass, default=1.0, help="nucleus mass when sampling (default 1: all)")
    p.add_argument("--min-p", type=fraction, default=0.0,
                   help="drop tokens below this fraction of the likeliest one's probability when sampling (default 0)")
    p.add_argument("--repetition-penalty", type=positive_float, default=1.0, metavar="R",
                   help="divide a positive logit (multiply a negative one) of every token of the context by R, "
                        "greedy or sampled (default 1: none)")
    p.add_argument("--presence-penalty", type=penalty_arg, default=0.0, metavar="P",
                   help="subtract P from the logit of every token the answer holds (-2 to 2; default 0)")
    p.add_argument("--frequency-penalty", type=penalty_arg, default=0.0, metavar="F",
                   help="subtract F per time the answer holds a token from its logit (-2 to 2; default 0)")
    p.add_argument("--sampling-matrix", action="store_true",
                   help="every mode under each setting clients send: greedy; temperature 0.7; with top_p 0.9; with "
                        "top_p 0.8, top_k 20 and repetition_penalty 1.05; greedy with repetition_penalty 1.05 (the "
                        "penalty alone); with min_p 0.05 (the sampling and penalty flags are then ignored)")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="the seed of every sampled run (default 0)")
    p.add_argument("--acceptance", choices=["race", "rejection"], default=None,
                   help="when sampling, run the speculative modes under this rule only (default: both)")
    p.set_defaults(func=cmd_bench)


def cmd_doctor(args: argparse.Namespace) -> int:
    from specedge.doctor import report

    print(report())
    return 0


def add_model_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="the providers this installation has, and where each cached artifact runs")
    p.set_defaults(func=cmd_doctor)
    p = sub.add_parser("models", help="list the registry's models and pairs, and what is cached")
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("rm", help="remove a registry model's exports from the cache (--weights: its weights too)")
    p.add_argument("name", help="a model or pair name from `specedge models` (NAME:QUANT: that format's exports)")
    p.add_argument("--weights", action="store_true", help="remove its fetched weights too (fetched again when used)")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed, and remove nothing")
    p.set_defaults(func=cmd_rm)
    p = sub.add_parser("prune", help="remove the cached exports the default decoding does not use here (stale "
                                     "exports, formats ruled out, other models'); weights are kept")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed, and remove nothing")
    p.set_defaults(func=cmd_prune)
    p = sub.add_parser("fetch", help="download and verify a registry model's weights (or a pair's)")
    p.add_argument("name", help="a model or pair name from `specedge models` (NAME:QUANT: one export, for --reexport)")
    p.add_argument("--reexport", action="store_true",
                   help="also export it into the cache again, replacing the cached export (NAME:QUANT: that one; "
                        "NAME: each one cached), e.g. one an error calls damaged")
    p.set_defaults(func=cmd_fetch)


def add_chat(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="multi-turn terminal chat (default: the Qwen2.5-Coder pair, offline)")
    add_pair_flags(p)
    add_gamma_flags(p)
    p.add_argument("--show-draft", action="store_true", help="colour the tokens the draft proposed")
    p.add_argument("-p", "--prompt", help="answer this one message and exit")
    p.add_argument("--system", default=None, help="a system message")
    add_context_flag(p)
    add_template_flags(p)
    add_sampling_flags(p, max_new_tokens=512)
    add_provider_flags(p)
    p.set_defaults(func=cmd_chat)


def add_export(sub: argparse._SubParsersAction) -> None:
    from specedge.export.settings import DEFAULT_CONTEXT, DEFAULT_WIDTHS

    p = sub.add_parser("export", help="export a HF checkpoint or GGUF file to a quantized ONNX artifact")
    p.add_argument("--model", required=True, help="a Hugging Face checkpoint folder or a .gguf file")
    p.add_argument("--out", required=True, help="the artifact folder to write")
    p.add_argument("--quant", default=None, choices=["fp32", "int8", "int4", "w8a8", "qdq"],
                   help="weight format of the MatMuls (default: int4 MatMulNBits block 32 for cpu and qnn - "
                        "the HTP runs it with fp16 activations -, fp32 for dml; qdq: uint8 weights, uint16 "
                        "activations for qnn)")
    p.add_argument("--block-size", type=int, default=32, choices=[16, 32, 64, 128, 256],
                   help="int4/int8 block: 32 is row-exact as built (load probes whether this CPU keeps "
                        "it); larger blocks make a 1-token step faster (a draft, or a target verifying in "
                        "row pairs)")
    p.add_argument("--attention", default="exact", choices=["exact", "fused"],
                   help="exact: rows of a wide pass equal 1-token steps as built (a target); fused: ONNX Runtime's "
                        "GroupQueryAttention, cache updated in place, faster steps, rows equal only in whole "
                        "groups (a draft, or a target verifying in row pairs)")
    p.add_argument("--int4-kernel", default=None, choices=["rows", "nbits"],
                   help="CPU int4 weights: rows, specedge's native kernel (each row computed alone: rows exact "
                        "at any width and block, cheap wide passes); nbits, ONNX Runtime's MatMulNBits (default: "
                        "rows where the native library is built, block 32, 64 or 128)")
    p.add_argument("--head-vocab", type=int, default=0, metavar="N",
                   help="score only token ids below N in the output head: a cheaper step for a draft, "
                        "which then never proposes the rarer tokens (default: the full vocabulary)")
    p.add_argument("--for", dest="target_provider", default="cpu", choices=["cpu", "qnn", "dml"],
                   help="cpu: one graph for every width; qnn / dml: a static graph per width, shared weights")
    p.add_argument("--fp16", action="store_true", help="store float weights in fp16 (DirectML)")
    p.add_argument("--context", type=positive_int, default=DEFAULT_CONTEXT, help="KV cache capacity C in tokens")
    p.add_argument("--widths", type=parse_widths, default=DEFAULT_WIDTHS,
                   help="sequence widths S the graph serves: 1, gamma+1 for each gamma, the prefill chunk")
    p.add_argument("--force", action="store_true",
                   help="replace the specedge artifact in --out: the files its manifest lists; any other file "
                        "in the folder is kept")
    p.add_argument("--soc", default=None, metavar="SOC",
                   help="qnn: the Snapdragon the artifact is for (a QNN soc_model number, a SoC name such as "
                        "SM8650, or a device profile such as snapdragon-8-gen-3; default 60, SC8380XP)")
    p.add_argument("--contexts", default=None, choices=["shared", "per-width", "both"],
                   help="qnn: also compile the graphs for --soc with Qualcomm's HTP compiler (onnxruntime-qnn) into "
                        "qnn_ctx/: shared = one weights binary for all widths (for the device), per-width = one "
                        "per width (loads anywhere, also on x86_64)")
    p.set_defaults(func=cmd_export)


def add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text with speculative decoding")
    p.add_argument("--pair", default=DEFAULT_PAIR, help=f"a registry pair, without --target (default {DEFAULT_PAIR}, "
                                                       "decoded the way measured fastest here)")
    p.add_argument("-m", "--target", default=None, help="target artifact folder or registry model name")
    drafters = p.add_mutually_exclusive_group()
    drafters.add_argument("--draft", help="draft artifact folder or registry model name")
    drafters.add_argument("--no-draft", action="store_true", help="plain decoding of the target")
    add_gamma_flags(p)
    prompts = p.add_mutually_exclusive_group()
    prompts.add_argument("-p", "--prompt", default=None, help="the prompt (-: read it from standard input)")
    prompts.add_argument("-f", "--file", default=None, metavar="FILE", help="read the prompt from this UTF-8 file")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    add_context_flag(p)
    add_template_flags(p)
    p.add_argument("--suffix", default=None, metavar="TEXT",
                   help="fill in the middle: write what goes between --prompt and this text, through the model's "
                        "fill-in-the-middle tokens (code models such as qwen2.5-coder)")
    shapes = p.add_mutually_exclusive_group()
    shapes.add_argument("--json-schema", metavar="FILE", help="the output follows this JSON schema (constrained "
                                                              "decoding, lossless under speculation)")
    shapes.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    shapes.add_argument("--regex", metavar="RE", help="the output matches this regular expression")
    shapes.add_argument("--grammar", metavar="FILE", help="the output follows this Lark grammar (.gbnf: GBNF)")
    add_sampling_flags(p, max_new_tokens=128)
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="decode exactly --max-new-tokens")
    add_provider_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object with text, ids and stats")
    p.set_defaults(func=cmd_generate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specedge", description="Lossless speculative decoding for small language models on ONNX Runtime.")
    parser.add_argument("--version", action="version", version=f"specedge {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (or SPECEDGE_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_chat(sub)
    add_generate(sub)
    add_export(sub)
    add_model_commands(sub)
    add_profile(sub)
    add_bench(sub)
    add_serve_parser(sub)
    return parser


def _terminate(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # run the cleanup of half-written work, as Ctrl-C does


def describe_os_error(e: OSError) -> SpecEdgeError:
    """An operating-system error as a problem and what to do about it."""
    where = f" {e.filename}" if e.filename else ""
    reason = e.strerror or str(e)
    if is_disk_full(e):
        return SpecEdgeError(f"the disk is full{' writing' + where if where else ''}",
                             "free some space, or point SPECEDGE_CACHE (or --out) at another disk")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return SpecEdgeError(f"cannot access{where}: {reason}",
                             "check its permissions, or point SPECEDGE_CACHE (or --out) at a writable folder")
    if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR):
        return SpecEdgeError(f"{reason}:{where}", "check the path")
    return SpecEdgeError(f"{reason}{':' + where if where else ''}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Every failure ends as one line on stderr: exit 2 for bad input or a
    problem the user can fix, 1 for an internal error, 130 for Ctrl-C; --debug (or SPECEDGE_DEBUG=1)
    shows the traceback too."""
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("SPECEDGE_DEBUG", "") not in ("", "0")
    signal.signal(signal.SIGTERM, _terminate)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("\nspecedge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into a reader that stopped (e.g. head)
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - no flush error at exit
        return 0
    except Exception as e:
        if debug:
            traceback.print_exc()
        error, code = as_user_error(e)
        print(f"specedge: error: {error}", file=sys.stderr)
        if code == 1 and not debug:
            print("specedge: this is a bug in specedge; rerun with --debug for the traceback and report it",
                  file=sys.stderr)
        return code


def as_user_error(e: Exception) -> tuple[SpecEdgeError | str, int]:
    """(the line to print, exit code) for any exception a command raised."""
    if isinstance(e, DamagedArtifactError):  # for a registry model's cached export: the command that rebuilds it
        from specedge.rebuild import rebuild_advice

        return rebuild_advice(e), 2
    if isinstance(e, SpecEdgeError):
        return e, 2
    if isinstance(e, OSError):
        return describe_os_error(e), 2
    if isinstance(e, MemoryError):
        return SpecEdgeError("not enough memory", "close other programs, or use a smaller model or --context"), 2
    first = (str(e).strip().splitlines() or [""])[0][:300]
    return f"internal error: {type(e).__name__}{': ' + first if first else ''}", 1


if __name__ == "__main__":
    sys.exit(main())
