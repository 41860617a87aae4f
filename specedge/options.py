"""The options the commands share, and what their values load: argument types, the flag groups
(`add_pair_flags`, `add_gamma_flags`, `add_sampling_flags`, `add_provider_flags`), and the builders
that read them (`build_config`, `artifact_arg`, `pair_paths`, `default_pair`, `load_generator`).

Used by `specedge` (cli.py), `specedge serve` (serve/command.py), bench/ and scripts/. Imports only
the standard library and the registry at module level, so building a parser loads no runtime.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from specedge.core.contract import DEFAULT_GAMMA
from specedge.core.errors import SpecEdgeError
from specedge.hub import hub_artifact, is_hub_name
from specedge.models.registry import DEFAULT_PAIR, MODELS

if TYPE_CHECKING:
    from specedge.defaults import Decoding
    from specedge.runtime.generator import Generator
    from specedge.runtime.round.decoding import SpecConfig


# -- argument types ----------------------------------------------------------------------------
def gamma_arg(text: str) -> str:
    if text != "auto":
        try:
            int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"gamma must be an integer or auto, got '{text}'") from None
    return text


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {'whole ' if kind is int else ''}number, got '{text}'") from None


def nonnegative_int(text: str) -> int:
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def nonnegative_float(text: str) -> float:
    value = _number(text, float)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def probability_mass(text: str) -> float:
    value = _number(text, float)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1] (1 keeps every token), got {text}")
    return value


def fraction(text: str) -> float:
    value = _number(text, float)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {text}")
    return value


def penalty_arg(text: str) -> float:
    value = _number(text, float)
    if not -2 <= value <= 2:
        raise argparse.ArgumentTypeError(f"expected a number from -2 to 2, got {text}")
    return value


def logit_bias_arg(text: str) -> dict[int, float]:
    """ID=BIAS pairs, comma-separated: {id: bias}."""
    out = {}
    for part in text.split(","):
        token, sep, bias = part.partition("=")
        if not sep or not token.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected ID=BIAS pairs such as 151643=-100, got '{part}'")
        value = _number(bias, float)
        if not -100 <= value <= 100:
            raise argparse.ArgumentTypeError(f"a bias is a number from -100 to 100, got {bias}")
        out[int(token)] = value
    return out


def positive_int(text: str) -> int:
    value = nonnegative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a number >= 1, got 0")
    return value


def positive_float(text: str) -> float:
    value = nonnegative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a number > 0, got 0")
    return value


def parse_widths(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(sorted({int(w) for w in text.split(",") if w.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"widths must be comma-separated integers, got '{text}'") from None
    if not widths:
        raise argparse.ArgumentTypeError("widths must list at least one integer")
    return widths


# -- flag groups -------------------------------------------------------------------------------
def add_pair_flags(p: argparse.ArgumentParser) -> None:
    """--pair, or --target and --draft (read by `pair_paths` and `default_pair`)."""
    p.add_argument("--pair", default=DEFAULT_PAIR, help=f"a registry pair (default {DEFAULT_PAIR}), or one on the "
                   "Hugging Face Hub: qwen3, qwen3-4b, qwen3-8b, gemma3, llama3.2 (`specedge models` lists them)")
    p.add_argument("-m", "--target", help="target artifact folder or registry model (instead of --pair)")
    p.add_argument("--draft", help="draft artifact folder or registry model (with --target)")


def add_gamma_flags(p: argparse.ArgumentParser) -> None:
    """--ngram and --gamma: how drafts are made, and how many per round."""
    p.add_argument("--ngram", action="store_true",
                   help="draft by n-gram lookup in the context; with a draft model: hybrid (lookup where it matches)")
    p.add_argument("--gamma", type=gamma_arg, default=None,
                   help="draft tokens per target pass, or auto (default): chosen each round from measured "
                        "acceptance and pass times, plain decoding where speculation does not pay")


def add_sampling_flags(p: argparse.ArgumentParser, max_new_tokens: int, per_request: bool = False) -> None:
    """-n/--max-tokens/--max-new-tokens, --temperature/--temp, --top-k, --top-p, --min-p, the
    penalties and --logit-bias, -s/--seed, --sampling-defaults (read by `build_config`), llama-cli's
    and mlx-lm's short names beside the long ones. A sampling flag left out takes the model's own
    default where --sampling-defaults model asks for them, else the command's (greedy; the server:
    OpenAI's). per_request: they are a server's values for a request that sets none."""
    when = " when a request sets none" if per_request else ""
    unset = "the model's with --sampling-defaults model, else " if not per_request else "the model's, else "
    tokens = ("-n", "--max-tokens", "--max-new-tokens")
    p.add_argument(*tokens, dest="max_new_tokens", type=positive_int, default=max_new_tokens, metavar="N",
                   help=f"tokens to generate{when} (default {max_new_tokens})")
    p.add_argument("--temperature", "--temp", type=nonnegative_float, default=None,
                   help=f"sampling temperature{when}; 0 is greedy (default: {unset}{1 if per_request else 0})")
    p.add_argument("--top-k", type=nonnegative_int, default=None,
                   help=f"sample from the k likeliest tokens{when} (default: {unset}0, all)")
    p.add_argument("--top-p", type=probability_mass, default=None,
                   help=f"sample from the likeliest tokens of this probability mass{when} (default: {unset}1, all)")
    p.add_argument("--min-p", type=fraction, default=None,
                   help=f"drop tokens less likely than this fraction of the likeliest{when} (default: {unset}0)")
    p.add_argument("--presence-penalty", type=penalty_arg, default=None, metavar="P",
                   help=f"subtract P from the logit of every token the answer holds{when} (-2 to 2; default: "
                        f"{unset}0)")
    p.add_argument("--frequency-penalty", type=penalty_arg, default=None, metavar="F",
                   help=f"subtract F per time the answer holds a token from its logit{when} (-2 to 2; default: "
                        f"{unset}0)")
    p.add_argument("--repeat-penalty", "--repetition-penalty", dest="repetition_penalty", type=positive_float,
                   default=None, metavar="R", help=f"divide a positive logit (multiply a negative one) of every "
                                                   f"token of the context by R{when} (default: {unset}1, none)")
    p.add_argument("--repeat-last-n", type=nonnegative_int, default=0, metavar="N",
                   help=f"the repeat penalty reads the context's last N tokens only{when} (default 0: all)")
    p.add_argument("--logit-bias", type=logit_bias_arg, default=None, metavar="ID=BIAS,...",
                   help=f"add BIAS (-100 to 100) to token ID's logit{when}, e.g. 151643=-100")
    choices = ["model", "openai"] if per_request else ["greedy", "model"]
    p.add_argument("--sampling-defaults", choices=choices, default=choices[0],
                   help="for the sampling flags left out: the model's own generation defaults (its "
                        "generation_config.json, or the registry's from its model card) or "
                        + ("OpenAI's API defaults (default: model)" if per_request else "greedy decoding "
                           "(default: greedy)"))
    p.add_argument("-s", "--seed", type=nonnegative_int, default=None,
                   help=f"the same seed draws the same tokens{when} (default: a fresh seed)")
    p.add_argument("--acceptance", choices=["race", "rejection"], default=None,
                   help=f"how sampled drafts are verified{when}: race, the tokens of plain sampling with the "
                        "same seed; rejection, min(1, p/q) with residual resampling, more tokens per pass "
                        "(default: race with --seed, rejection without)")


def add_template_flags(p: argparse.ArgumentParser) -> None:
    """--chat-template FILE and --chat-template-kwargs JSON (applied by `load_generator`)."""
    p.add_argument("--chat-template", type=template_file_arg, default=None, metavar="FILE",
                   help="render chats with this Jinja template instead of the model's own")
    p.add_argument("--chat-template-kwargs", type=template_kwargs_arg, default=None, metavar="JSON",
                   help="""extra variables for the chat template, a JSON object, e.g. '{"enable_thinking": false}'""")


def template_file_arg(path: str) -> str:
    from specedge.runtime.text.template.options import compile_check, read_template

    try:
        source = read_template(path)
        compile_check(source, path)
        return source
    except SpecEdgeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def template_kwargs_arg(text: str) -> dict[str, object]:
    from specedge.runtime.text.template.options import parse_template_kwargs

    try:
        return parse_template_kwargs(text)
    except SpecEdgeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_context_flag(p: argparse.ArgumentParser) -> None:
    """-c/--context N: the tokens a registry model's or a source's export holds (read by the commands)."""
    p.add_argument("-c", "--context", type=positive_int, default=None, metavar="N",
                   help="tokens of context (prompt and answer) the model holds, up to what it was trained for "
                        "(default: 4096); exported once per capacity")


def say_context(gen: Generator, context: int) -> None:
    """The capacity asked for, and what its KV caches cost at most (an artifact folder keeps its own)."""
    held = gen.target.manifest.context
    if held != context:
        raise SpecEdgeError(f"{gen.target.folder} holds {held} tokens of context, not the {context} asked for",
                            "-c applies to registry models and sources (GGUF, checkpoints, hf:), which it "
                            "exports at that size; re-export the artifact with --context")
    from specedge.runtime.generator import draft_model

    draft = draft_model(gen.drafter)
    models = (gen.target.manifest, *([draft.manifest] if draft is not None else []))
    kv = sum(m.costs.kv_slot_bytes * m.context for m in models)  # keys and values of every layer, every slot
    print(f"specedge: context {context} tokens: the KV cache takes up to {kv / 1e6:.0f} MB", file=sys.stderr)


def add_provider_flags(p: argparse.ArgumentParser) -> None:
    """--provider, --draft-provider, --fallback, --threads, --soc (read by `load_generator`)."""
    from specedge.runtime import qnn  # the SoC catalogue: standard library only (no onnxruntime)

    p.add_argument("--provider", default="cpu", help="execution provider: cpu, dml or qnn")
    p.add_argument("--draft-provider", default=None, help="provider of the draft (default: --provider)")
    p.add_argument("--fallback", choices=["cpu"], default=None,
                   help="run on this provider (and say so) when the asked one is missing")
    p.add_argument("-t", "--threads", type=positive_int, default=None, help="onnxruntime threads per model")
    p.add_argument("--soc", action=qnn.SocArgument, default=None, metavar="SOC",
                   help="qnn: the Snapdragon to compile for: a QNN soc_model number, a SoC name (SM8650) or a "
                        "device profile (snapdragon-8-gen-3); default: the one the artifact was exported for, else 60")


# -- what the flags load -----------------------------------------------------------------------
# the sampling fields a flag may leave to the model (core/contract.py's GENERATION_FIELDS), and their
# values where neither sets them: greedy decoding (chat, generate) or OpenAI's API (the server)
GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0,
          "presence_penalty": 0.0, "frequency_penalty": 0.0}
OPENAI = {**GREEDY, "temperature": 1.0}


def sampling_values(args: argparse.Namespace, base: Mapping[str, float], model: Mapping[str, float]
                    ) -> dict[str, float]:
    """Each sampling field: its flag where given, else the model's own default (`model`: empty unless
    asked for), else `base`'s."""
    return {name: next(v for v in (getattr(args, name, None), model.get(name), default) if v is not None)
            for name, default in base.items()}


def sampling_of(args: argparse.Namespace, base: Mapping[str, float] = GREEDY,
                model: Mapping[str, float] | None = None):  # type: ignore[no-untyped-def]  # -> SamplingParams
    """The SamplingParams of the sampling flags over `base` and, where --sampling-defaults model asks
    for them, the model's own defaults (`model`)."""
    from specedge.kernels.penalties import Penalties
    from specedge.kernels.sampling import SamplingParams  # numpy: loaded when a command runs

    v = sampling_values(args, base, model if model is not None and args.sampling_defaults == "model" else {})
    penalties = Penalties(presence=v["presence_penalty"], frequency=v["frequency_penalty"],
                          repetition=v["repetition_penalty"], last_n=args.repeat_last_n,
                          bias=tuple(sorted((args.logit_bias or {}).items())))
    return SamplingParams(temperature=v["temperature"], top_k=int(v["top_k"]), top_p=v["top_p"], min_p=v["min_p"],
                          penalties=penalties)


def build_config(args: argparse.Namespace, no_draft: bool = False, stop: Sequence[str] | None = None,
                 ignore_eos: bool = False, base: Mapping[str, float] = GREEDY,
                 model: Mapping[str, float] | None = None) -> SpecConfig:
    """The SpecConfig of the flags `add_gamma_flags` and `add_sampling_flags` declare (--gamma,
    --max-new-tokens, the sampling flags over `base` and the model's defaults `model`, --seed); the
    rest as arguments."""
    from specedge.runtime.round.decoding import SpecConfig  # onnxruntime: loaded when a command runs

    auto = args.gamma in (None, "auto") and not no_draft  # None: not given, auto
    gamma = 0 if no_draft else (DEFAULT_GAMMA if auto else int(args.gamma))
    return SpecConfig(gamma=gamma, auto_gamma=auto, max_new_tokens=args.max_new_tokens,
                      sampling=sampling_of(args, base, model), stop_strings=tuple(stop or ()), seed=args.seed,
                      ignore_eos=ignore_eos, acceptance=getattr(args, "acceptance", None) or "auto")


def artifact_arg(value: str, context: int | None = None) -> Path:
    """An artifact folder; the name of a registry model, optionally NAME:QUANT (fetched and exported
    on first use; without a quant, the export chosen for this machine); a GGUF file, a Hugging Face
    checkpoint folder or an `hf:OWNER/REPO[:TAG]` name (exported into the cache on first use).
    context: the tokens an export it makes holds (an artifact folder keeps its own)."""
    from specedge.core.contract import QUANT_BITS  # numpy (through kernels): loaded when a command runs

    path = Path(value)
    name, _, quant = value.partition(":")
    if is_hub_name(value):
        return hub_artifact(value, context)
    if is_source(path):
        from specedge.resolve import source_artifact

        return source_artifact(path, context=context)
    if path.exists() or name not in MODELS or (quant and quant not in QUANT_BITS):
        return path
    from specedge.defaults import default_artifact  # the runtime and device profiles: only for a registry name

    return default_artifact(name, quant or None, context)


def is_source(path: Path) -> bool:
    """A GGUF file, or a Hugging Face checkpoint folder (config.json, no artifact manifest)."""
    return (path.is_file() and path.suffix == ".gguf") or (
        path.is_dir() and (path / "config.json").is_file() and not (path / "manifest.json").is_file())


def pair_paths(pair: str, target: str | None = None, draft: str | None = None,
               context: int | None = None) -> tuple[Path, Path | None]:
    """(target, draft): the given target (and draft) artifacts, else the registry pair's
    (the flags `add_pair_flags` declares: --target and --draft, else --pair)."""
    if target:
        return artifact_arg(target, context), artifact_arg(draft, context) if draft else None
    from specedge.defaults import pair_artifacts  # the runtime and device profiles: loaded when a command runs

    target_path, draft_path = pair_artifacts(pair, context)
    return target_path, draft_path


def default_pair(pair: str, target: str | None = None, draft: str | None = None, gamma: str | None = None,
                 ngram: bool = False, context: int | None = None) -> Decoding:
    """How chat and serve decode (a `defaults.Decoding`): the registry pair's measured default way
    (its target's export, with its draft, draft and n-gram, or plainly in 1-token steps), unless
    a target, a gamma or ngram (--target, --gamma, --ngram) say otherwise; prints which way, and
    why, in one line."""
    from specedge.defaults import Decoding, pair_decoding  # the runtime and device profiles: when a command runs

    if target or gamma is not None or ngram:
        target_path, draft_path = pair_paths(pair, target, draft, context)
        decoding = Decoding(target_path, draft_path, ngram, False, "as the flags say")
    else:
        decoding = pair_decoding(pair, context)
    print(f"specedge: {decoding.line}", file=sys.stderr)
    return decoding


def load_generator(args: argparse.Namespace, target: Path, draft: Path | None, ngram: bool, config: SpecConfig,
                   single_steps: bool = False) -> Generator:
    """A Generator on the providers the flags of `add_provider_flags` name, with this machine's
    measured bandwidth for the stats."""
    from specedge.runtime.generator import Generator

    gen = Generator.load(target, draft=draft, ngram=ngram, provider=args.provider, draft_provider=args.draft_provider,
                         threads=args.threads, config=config, fallback=args.fallback, single_steps=single_steps)
    finish_load(gen, getattr(args, "context", None), getattr(args, "chat_template", None),
                getattr(args, "chat_template_kwargs", None))
    return gen


def finish_load(gen: Generator, context: int | None, template: str | None, template_kwargs: object) -> None:
    """What a loaded Generator gets before it decodes, from the CLI or the Python API: this
    machine's measured bandwidth for the stats, the context check and its KV cost, the chat template."""
    from specedge.profiling import measured_bandwidth  # the runtime (onnxruntime): loaded when a command runs

    gen.bandwidth_gb_per_s = measured_bandwidth()
    if context:
        say_context(gen, context)
    gen.codec.use_template(template, template_kwargs)  # type: ignore[arg-type]
