"""The registry's models tokenize as transformers tokenizes their GGUF files: the tokenizer a first
use exports (fetched and exported as `specedge chat` does) gives transformers' ids for code, prose,
whitespace, digits, non-Latin text and the special tokens' texts, with and without the model's own
added tokens; its end-of-generation ids include transformers' EOS, and the FIM tokens are the ids
transformers names."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from specedge.core.manifest import load_manifest
from specedge.models.fetch import fetch
from specedge.models.registry import MODELS
from specedge.runtime.text.fim import find_fim_tokens
from tests.conftest import registry_artifact

pytestmark = [pytest.mark.slow, pytest.mark.reference]
TEXTS = [
    "def merge(a: list[int], b: list[int]) -> list[int]:\n\treturn sorted(a + b)  # O(n log n)\n",
    "The quick brown fox   jumps over\n\n\nthe lazy dog. 1234567890 3.14159 -0.5e-10",
    "    if (x != NULL && *x == '\\0') { return -1; }\r\n",
    "Grüße aus München — naïve café, 東京都, Привет мир, مرحبا, 🙂🚀 and a lone emoji 🧪.",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|> <|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    "",
    " ",
    "\n\n\n\n",
]


@pytest.fixture(scope="module", params=sorted(MODELS))
def tokenizers_of(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """(the exported tokenizer, its manifest, transformers' tokenizer of the same GGUF file)."""
    transformers = pytest.importorskip("transformers")
    name = request.param
    artifact = registry_artifact(name)
    gguf = fetch(name)
    reference = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return Tokenizer.from_file(str(artifact / "tokenizer.json")), load_manifest(artifact, verify=False), reference


@pytest.mark.parametrize("special", [False, True], ids=["text", "with-special"])
def test_the_exported_tokenizer_gives_transformers_ids(tokenizers_of, special: bool) -> None:  # type: ignore[no-untyped-def]
    ours, _, reference = tokenizers_of
    for text in TEXTS:
        want = reference(text, add_special_tokens=special)["input_ids"]
        assert ours.encode(text, add_special_tokens=special).ids == want, text
        assert ours.decode(want, skip_special_tokens=False) == reference.decode(want, skip_special_tokens=False)


def test_eos_and_fim_ids_are_transformers(tokenizers_of) -> None:  # type: ignore[no-untyped-def]
    ours, manifest, reference = tokenizers_of
    assert reference.eos_token_id in manifest.eos_token_ids
    named = [ids for names in FIM_NAMES if None not in (ids := tuple(known_id(reference, n) for n in names))]
    fim = find_fim_tokens(ours)
    assert (fim and (fim.prefix, fim.suffix, fim.middle)) == (named[0] if named else None)


FIM_NAMES = [("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")]


def known_id(reference, token: str) -> int | None:  # type: ignore[no-untyped-def]
    """transformers' id of a token of its vocabulary (None: not one of its tokens)."""
    i = reference.convert_tokens_to_ids(token)
    return None if i is None or i == reference.unk_token_id else i
