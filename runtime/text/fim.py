"""Fill-in-the-middle prompts: the text before and after a gap, around the model's own FIM tokens,
so it writes what goes between (`specedge generate --suffix`, the server's `suffix`).

    <|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>      Qwen2.5-Coder
    <fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>            StarCoder, SantaCoder

The prompt is built as token ids: the FIM tokens by id, the two texts encoded with no
special-token parsing, so a prefix or suffix that spells "<|fim_prefix|>" stays text. A model
whose tokenizer has none of these token sets cannot fill in a middle: `NoFimTokens`.

`infill_prompt` is llama-server's /infill (what llama.vscode and llama.vim send): other files of the
project go before the FIM prefix, in the repo-level pattern Qwen2.5-Coder was trained on where the
tokenizer has its tokens (https://arxiv.org/abs/2409.12186), and the prefix, the suffix and the
files are cut to fit the context as llama-server cuts them:

    <|repo_name|>myproject\n<|file_sep|>{name}\n{text}...<|file_sep|>filename\n<|fim_prefix|>...
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from specedge.core.errors import SpecEdgeError
from specedge.runtime.engine.model import check_token_ids
from specedge.runtime.text.codec import TextCodec

FIM_STYLES = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder
)
REPO_STYLES = (("<|repo_name|>", "<|file_sep|>"), ("<repo_name>", "<file_sep>"))  # Qwen2.5-Coder, StarCoder2
REPO_NAME = "myproject"  # the repository and the current file's names, as llama-server writes them
CURRENT_FILE = "filename"
SNIPPET = "\n\n--- snippet ---\n\n"  # a file's separator for a model without repo-level tokens (llama-server's)
INFILL_BATCH = 2048  # llama-server's batch: 3/4 of it for the prefix, 1/4 for the suffix


@dataclass(frozen=True)
class FimTokens:
    prefix: int
    suffix: int
    middle: int


class NoFimTokens(SpecEdgeError):
    """The model's tokenizer has no fill-in-the-middle tokens."""

    def __init__(self, model: str) -> None:
        styles = " or ".join("/".join(style) for style in FIM_STYLES)
        super().__init__(f"the model '{model}' cannot fill in the middle: its tokenizer has no {styles} tokens",
                         "drop the suffix, or use a code model trained for it, such as qwen2.5-coder")


def find_fim_tokens(tokenizer: Tokenizer) -> FimTokens | None:
    """The ids of the first FIM token set the tokenizer has whole, or None."""
    for style in FIM_STYLES:
        ids = [tokenizer.token_to_id(token) for token in style]
        if all(i is not None for i in ids):
            return FimTokens(*ids)  # type: ignore[arg-type]
    return None


@dataclass(frozen=True)
class RepoTokens:
    name: int
    file: int


def find_repo_tokens(tokenizer: Tokenizer) -> RepoTokens | None:
    """The ids of the repo-level FIM tokens (repository name, file separator), or None."""
    for style in REPO_STYLES:
        ids = [tokenizer.token_to_id(token) for token in style]
        if all(i is not None for i in ids):
            return RepoTokens(*ids)  # type: ignore[arg-type]
    return None


def infill_prompt(codec: TextCodec, prefix: str, suffix: str, model: str, typed: str = "",
                  files: Sequence[tuple[str, str]] = (), context: int = 4096, reserve: int = 0) -> list[int]:
    """llama-server's /infill prompt: the `files` (name, text) as project context, then
    [fim_prefix, *prefix, *typed, fim_suffix, *suffix, fim_middle] (`typed`: the text before the
    cursor on its line). As llama-server fits it into a context of `context` tokens: of a batch of
    min(2048, context / 2) tokens, the prefix keeps its last 3/4, the suffix its first 1/4 (less
    the typed text); the files keep their last context - batch - `reserve` tokens (llama-server
    reserves twice n_predict; the latest files, nearest the cursor, are kept)."""
    fim = find_fim_tokens(codec.tokenizer)
    if fim is None:
        raise NoFimTokens(model)
    repo = find_repo_tokens(codec.tokenizer)

    def text(t: str, what: str) -> list[int]:
        return codec.encode(t, add_special_tokens=False, what=what, special_text=False) if t else []

    extra = [repo.name, *text(REPO_NAME + "\n", "")] if repo else []
    for i, (name, body) in enumerate(files):
        extra += [repo.file, *text(name + "\n", f"input_extra[{i}].filename")] if repo else text(SNIPPET, "")
        extra += text(body, f"input_extra[{i}].text")
    if repo:
        extra += [repo.file, *text(CURRENT_FILE + "\n", "")]
    batch = min(INFILL_BATCH, context // 2)
    before, tail = text(prefix, "the prefix"), text(typed, "the prompt")
    before = before[max(0, len(before) - 3 * batch // 4):]
    after = text(suffix, "the suffix")[:max(0, batch // 4 - 2 - len(tail))]
    take = min(len(extra), max(0, context - batch - reserve))
    return [*extra[len(extra) - take:], fim.prefix, *before, *tail, fim.suffix, *after, fim.middle]


def fim_prompt(codec: TextCodec, prefix: str | Sequence[int], suffix: str, model: str) -> list[int]:
    """[fim_prefix, *prefix, fim_suffix, *suffix, fim_middle]: the prefix as text or token ids
    (checked against the vocabulary), the suffix as text. NoFimTokens names `model` if it has none."""
    fim = find_fim_tokens(codec.tokenizer)
    if fim is None:
        raise NoFimTokens(model)
    before = (codec.encode(prefix, add_special_tokens=False, special_text=False) if isinstance(prefix, str)
              else check_token_ids(list(prefix), codec.manifest.vocab_size))
    after = codec.encode(suffix, add_special_tokens=False, what="the suffix", special_text=False)
    return [fim.prefix, *before, fim.suffix, *after, fim.middle]
