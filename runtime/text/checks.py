"""What the text side refuses: text that is not valid Unicode (the caller's input), and a
tokenizer whose ids the model does not have (a damaged artifact)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from specedge.core.errors import DamagedArtifactError, InvalidTextError
from specedge.core.manifest import TOKENIZER_NAME, Manifest

FOREIGN = "the tokenizer belongs to another model"


def check_text(text: str, what: str) -> None:
    """`text` can be encoded as UTF-8: no lone surrogate, such as Python's stand-in for a byte of a
    command line that is not UTF-8 (the tokenizer cannot take one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        byte = f", standing for the byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else ""
        raise InvalidTextError(f"{what} is not valid UTF-8 text (a lone surrogate U+{code:04X}{byte} at character "
                               f"{e.start + 1})", "pass text encoded as UTF-8") from None


def check_messages(messages: Iterable[object]) -> None:
    """Each text field of each chat message, by `check_text`, named by its place."""
    for i, message in enumerate(messages, start=1):
        if isinstance(message, Mapping):
            for key, value in message.items():
                if isinstance(value, str):
                    check_text(value, f"the {key} of message {i}" if isinstance(key, str) else f"message {i}")


def vocabulary_size(tokenizer: Tokenizer) -> int:
    """One more than the largest token id the tokenizer knows."""
    added = tokenizer.get_added_tokens_decoder()
    return max(tokenizer.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)


def check_vocabulary(tokenizer: Tokenizer, manifest: Manifest, folder: Path) -> None:
    """The tokenizer fits the model: its ids within the vocabulary the graph scores (checked
    against the manifest's vocab_size at load, runtime/engine/graph_facts.py), and the BOS and EOS
    tokens the manifest records among its tokens."""
    path = Path(folder) / TOKENIZER_NAME
    size = vocabulary_size(tokenizer)
    if size > manifest.vocab_size:
        raise DamagedArtifactError(folder, f"{path} has {size} tokens, more than the model's vocabulary of "
                                           f"{manifest.vocab_size}", FOREIGN)
    bos = () if manifest.bos_token_id is None else (manifest.bos_token_id,)
    for role, ids in (("beginning-of-sequence", bos), ("end-of-sequence", manifest.eos_token_ids)):
        for token in ids:
            if tokenizer.id_to_token(token) is None:
                raise DamagedArtifactError(folder, f"{path} has no token {token}, the {role} token of its manifest",
                                           FOREIGN)


def check_ids(ids: Sequence[int], manifest: Manifest, folder: Path) -> None:
    """Ids the tokenizer made are ids of the model (a tokenizer with gaps in its ids can pass
    `check_vocabulary` and still give one beyond it)."""
    if ids and (top := max(ids)) >= manifest.vocab_size:
        raise DamagedArtifactError(folder, f"{Path(folder) / TOKENIZER_NAME} gave the token id {top}, outside the "
                                           f"model's vocabulary of {manifest.vocab_size}", FOREIGN)
