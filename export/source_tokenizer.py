"""The tokenizer of a source, as tokenizer.json text, built with `tokenizers` alone.

From a GGUF file it is rebuilt from the tokenizer.ggml.* metadata exactly as transformers 5 builds
it (integrations/gguf/gguf_tokenizer_mapping.py and TokenizersBackend.__init__): byte-level BPE for
`gpt2` vocabularies with the split regex named by `tokenizer.ggml.pre`, Metaspace BPE with byte
fallback for sentencepiece (`llama`) ones, control tokens as special added tokens, user-defined ones
as plain added tokens, the named special tokens added, and a post-processor that prepends BOS where
the file says so. From a Hugging Face folder it is the folder's tokenizer.json with the special
tokens of tokenizer_config.json added the same way. tests/export/test_streaming_source.py checks
both against transformers' tokenizers: the same JSON for GGUF files, the same ids and text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from specedge.core.errors import SpecEdgeError

CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values

# the pre-tokenizer split regexes transformers attaches by tokenizer.ggml.pre (as of transformers 5.24)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3_SPLIT),
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
}
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
# tokens that end a generation wherever a GGUF file has them, as llama.cpp reads one (its
# end-of-generation set): Qwen2.5's instruct models end a turn of tool calls with <|endoftext|>,
# while the file's eos is <|im_end|>; Hugging Face's generation_config lists both
END_OF_GENERATION = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
                     "_<EOT>", "<|end▁of▁sentence|>", "<end_of_utterance>")


@dataclass(frozen=True)
class SourceTokenizer:
    json: str  # tokenizer.json text
    bos_token_id: int | None
    eos_token_id: int | None
    chat_template: str | None
    tokenizer: Any = field(default=None, repr=False)  # the tokenizers.Tokenizer built, for checks (not kept after)
    end_token_ids: tuple[int, ...] = ()  # more ids that end a generation (a GGUF's end-of-generation set)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def generate_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Merges a sentencepiece vocabulary implies: every split of a token into two tokens, best score first."""
    merges = []
    for merge, score in scores.items():
        local = [(merge[:i], merge[i:], score) for i in range(1, len(merge))
                 if merge[:i] in vocab and merge[i:] in vocab]
        merges.extend(sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]])))
    merges.sort(key=lambda v: (v[2], len(v[0]), len(v[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _byte_level(fields: dict, merges: list[tuple[str, str]]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
             for i, t in enumerate(fields["tokenizer.ggml.tokens"])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok, ("<|endoftext|>",) * 3  # GPT2Tokenizer's unk, bos and eos


def _sentencepiece(fields: dict, merges: list[tuple[str, str]] | None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tokens = fields["tokenizer.ggml.tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    if merges is None:
        merges = generate_merges(vocab, dict(zip(tokens, fields.get("tokenizer.ggml.scores", []), strict=False)))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1)])
    return tok, ("<unk>", "<s>", "</s>")  # LlamaTokenizer's unk, bos and eos


def _gemma(fields: dict, merges: list[tuple[str, str]] | None):
    """transformers' gemma_tokenizer: a token of spaces respelled with "▁", merges rebuilt best-first
    in the order the tokens are listed (Gemma's scores do not follow it), then GemmaTokenizer's
    pipeline: spaces to "▁" by a normalizer, split after each, BPE with byte fallback."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in fields["tokenizer.ggml.tokens"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    if merges is None:
        merges = generate_merges(vocab, {t: -i for i, t in enumerate(tokens)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, unk_token="<unk>", dropout=None,
                               byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.normalizer = normalizers.Replace(" ", "▁")
    return tok, ("<unk>", "<bos>", "<eos>", "<pad>", "<mask>")  # GemmaTokenizer's specials


def _add_missing_specials(tok, names: list[str | None]) -> None:
    """Named special tokens the tokenizer does not yet hold as added tokens, added as special ones."""
    from tokenizers import AddedToken

    held = {t.content for t in tok.get_added_tokens_decoder().values()}
    missing = []
    for name in names:
        if name is not None and name not in held and name not in missing:
            missing.append(name)
    if missing:
        tok.add_tokens([AddedToken(n, special=True) for n in missing])


def _set_post_processor(tok, bos: str | None, eos: str | None, add_bos: bool, add_eos: bool) -> None:
    """TokenizersBackend.update_post_processor: BOS / EOS around each sequence where asked for."""
    from tokenizers import processors

    add_bos, add_eos = add_bos and bos is not None, add_eos and eos is not None
    single = f"{(bos + ':0 ') if add_bos else ''}$A:0{(' ' + eos + ':0') if add_eos else ''}"
    pair = f"{single}{(' ' + bos + ':1') if add_bos else ''} $B:1{(' ' + eos + ':1') if add_eos else ''}"
    special = ([(bos, tok.token_to_id(bos))] if add_bos else []) + ([(eos, tok.token_to_id(eos))] if add_eos else [])
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


def gguf_tokenizer(fields: dict, path: Path) -> SourceTokenizer:
    """The tokenizer transformers builds from a GGUF file's metadata."""
    from tokenizers import AddedToken, Regex, pre_tokenizers

    kind = fields.get("tokenizer.ggml.model")
    if "tokenizer.ggml.tokens" not in fields:
        raise SpecEdgeError(f"{path} has no tokenizer (tokenizer.ggml.tokens)", "use a GGUF file with its vocabulary")
    arch = fields.get("general.architecture")
    merges = ([tuple(m.split(" ")) for m in fields["tokenizer.ggml.merges"]]
              if "tokenizer.ggml.merges" in fields else None)
    if kind == "gpt2":
        tok, defaults = _byte_level(fields, merges or [])
    elif kind == "llama" and arch not in ("gemma", "gemma2", "gemma3", "phi3"):
        tok, defaults = _sentencepiece(fields, merges)
    elif kind == "llama" and arch in ("gemma", "gemma2", "gemma3"):
        tok, defaults = _gemma(fields, merges)
    elif kind == "llama" and arch == "phi3":  # transformers' phi3_tokenizer: the prefix space from a normalizer
        from tokenizers import normalizers

        tok, defaults = _sentencepiece(fields, merges)
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(prepend="▁"), normalizers.Replace(" ", "▁")])
        tok.pre_tokenizer = None
    else:
        raise SpecEdgeError(f"{path} has a tokenizer of kind {kind!r} for {arch}",
                            "specedge builds byte-level BPE (gpt2) and sentencepiece (llama) GGUF tokenizers")
    _add_missing_specials(tok, list(defaults))  # the builder class's own defaults
    tokens, types = fields["tokenizer.ggml.tokens"], fields.get("tokenizer.ggml.token_type") or []
    spelled = set(bytes_to_unicode().values()) if kind == "gpt2" else None
    control = [AddedToken(t, normalized=False, special=True) for t, ty in zip(tokens, types, strict=False)
               if ty == CONTROL and (spelled is None or set(t) <= spelled)]
    if control:
        tok.add_special_tokens(control)
    vocab = tok.get_vocab()
    user = [AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types, strict=False)
            if ty == USER_DEFINED and t in vocab]
    if user:
        tok.add_tokens(user)
    split = PRE_TOKENIZER_SPLITS.get(fields.get("tokenizer.ggml.pre"))
    if split is not None:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                              use_regex=False)])
    named = {name: _token(tokens, fields.get(f"tokenizer.ggml.{key}"))
             for name, key in zip(SPECIAL_NAMES, ("bos_token_id", "eos_token_id", "unknown_token_id",
                                                  "padding_token_id"), strict=True)}
    _add_missing_specials(tok, list(named.values()))
    add_bos = fields.get("tokenizer.ggml.add_bos_token", kind == "llama")
    add_eos = fields.get("tokenizer.ggml.add_eos_token", False)
    explicit = kind == "llama" or "tokenizer.ggml.add_bos_token" in fields or "tokenizer.ggml.add_eos_token" in fields
    if explicit or tok.post_processor is None:
        _set_post_processor(tok, named["bos_token"], named["eos_token"], bool(add_bos), bool(add_eos))
    template = fields.get("tokenizer.chat_template")
    return SourceTokenizer(json=tok.to_str(), tokenizer=tok, bos_token_id=_id(tok, named["bos_token"]),
                           eos_token_id=_id(tok, named["eos_token"]),
                           chat_template=template if isinstance(template, str) else None,
                           end_token_ids=end_of_generation(fields, tokens))


def end_of_generation(fields: dict, tokens: list[str]) -> tuple[int, ...]:
    """The ids a GGUF file's end-of-turn and end-of-message fields name, then those of the tokens
    spelled as one of END_OF_GENERATION, in id order."""
    named = [fields.get(f"tokenizer.ggml.{key}") for key in ("eot_token_id", "eom_token_id")]
    ids = [i for i in named if isinstance(i, int) and 0 <= i < len(tokens)]
    ids += [i for i, token in enumerate(tokens) if token in END_OF_GENERATION and i not in ids]
    return tuple(ids)


def _token(tokens: list[str], index: object) -> str | None:
    return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else None


def _id(tok, token: str | None) -> int | None:
    return None if token is None else tok.token_to_id(token)


def hf_tokenizer(folder: Path) -> SourceTokenizer:
    """The folder's tokenizer.json with tokenizer_config.json's special tokens, as transformers loads it."""
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise SpecEdgeError(f"{folder} has no fast tokenizer (tokenizer.json)",
                            "add tokenizer.json to the checkpoint folder")
    try:
        tok = Tokenizer.from_str(path.read_text(encoding="utf-8"))
    except Exception as e:  # tokenizers raises its own exception types for malformed files
        raise SpecEdgeError(f"{path} is not a valid tokenizer.json ({str(e)[:200]})",
                            "the checkpoint is damaged; download it again") from None
    config = _json_dict(folder / "tokenizer_config.json")
    specials = _json_dict(folder / "special_tokens_map.json")
    named = {name: _content(config.get(name, specials.get(name))) for name in SPECIAL_NAMES}
    tok.no_truncation()
    if tok.padding is not None:
        tok.no_padding()
    _add_missing_specials(tok, list(named.values()))
    explicit = "add_bos_token" in config or "add_eos_token" in config
    if explicit or tok.post_processor is None:
        _set_post_processor(tok, named["bos_token"], named["eos_token"], bool(config.get("add_bos_token", False)),
                            bool(config.get("add_eos_token", False)))
    jinja = folder / "chat_template.jinja"
    template = jinja.read_text(encoding="utf-8") if jinja.is_file() else config.get("chat_template")
    return SourceTokenizer(json=tok.to_str(), tokenizer=tok, bos_token_id=_id(tok, named["bos_token"]),
                           eos_token_id=_id(tok, named["eos_token"]),
                           chat_template=template if isinstance(template, str) else None)


def _content(value: object) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _json_dict(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecEdgeError(f"{path} is not valid JSON ({e})", "the checkpoint is damaged; download it again") from None
    return data if isinstance(data, dict) else {}
