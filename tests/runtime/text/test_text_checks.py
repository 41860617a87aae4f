"""Text that is not valid UTF-8 is the caller's error, named in one line; a tokenizer whose ids the
model does not have (swapped in, its checksum and fingerprint forged) is refused at load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from specedge.core.errors import DamagedArtifactError, InvalidTextError, SpecEdgeError
from specedge.core.manifest import MANIFEST_NAME, sha256_file, tokenizer_fingerprint
from specedge.runtime import Generator, SpecConfig
from tests.tiny_models import SPECIALS, byte_tokenizer


@pytest.fixture(scope="module")
def plain(tiny_llama: tuple[Path, Path, Path]) -> Generator:
    return Generator.load(tiny_llama[1], config=SpecConfig(gamma=0, max_new_tokens=2))


BAD_TEXT = {  # prompt -> words of the error
    "an undecodable byte of a command line": ("ab\udcffcd", ("the prompt", "U+DCFF", "byte 0xff", "character 3")),
    "half of a surrogate pair": ("\ud83d!", ("the prompt", "U+D83D", "character 1")),
    "in a chat message": ([{"role": "user", "content": "hi \udc80"}], ("the content of message 1", "character 4")),
    "in a system message": ([{"role": "system", "content": "\udfff"}, {"role": "user", "content": "hi"}],
                            ("the content of message 1", "U+DFFF")),
}


@pytest.mark.parametrize("case", list(BAD_TEXT))
def test_text_that_is_not_utf8_is_one_clear_error(plain: Generator, case: str) -> None:
    prompt, words = BAD_TEXT[case]
    with pytest.raises(InvalidTextError) as e:
        plain.generate(prompt)
    assert isinstance(e.value, SpecEdgeError) and isinstance(e.value, ValueError)  # a server's 400
    assert all(w in str(e.value) for w in (*words, "not valid UTF-8")), str(e.value)
    str(e.value).encode("utf-8")  # the message itself prints anywhere


def test_a_chat_prompt_that_is_not_utf8_is_refused(plain: Generator) -> None:
    with pytest.raises(InvalidTextError, match="the content of message 1 is not valid UTF-8"):
        plain.generate("ab\udcffcd", chat=True)


def test_valid_text_still_encodes(plain: Generator) -> None:
    text = "héllo 世界 🙂"
    ids = plain.encode(text)
    assert len(ids) == len(text.encode()) and plain.codec.decode(ids) == text  # a token a byte


def forge(art: Path, tok: Tokenizer) -> None:
    """Swap in `tok` and record its checksum and fingerprint in the manifest, as a forger would."""
    tok.save(str(art / "tokenizer.json"))
    manifest = json.loads((art / MANIFEST_NAME).read_text())
    manifest["files"]["tokenizer.json"] = {"size": (art / "tokenizer.json").stat().st_size,
                                           "sha256": sha256_file(art / "tokenizer.json")}
    manifest["tokenizer_fingerprint"] = tokenizer_fingerprint((art / "tokenizer.json").read_text())
    (art / MANIFEST_NAME).write_text(json.dumps(manifest))


def larger() -> Tokenizer:
    tok = byte_tokenizer()
    tok.add_tokens([f"word{i}" for i in range(100)])  # another model's: 360 ids for a model of 260
    return tok


def without_specials() -> Tokenizer:
    return byte_tokenizer(256)  # no BOS (256) nor EOS (257)


def sparse() -> Tokenizer:
    """As many ids as the model has, but 'a' at id 1000: only what it encodes shows it."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: (1000 if ch == "a" else i) for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok


@pytest.fixture
def artifact(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> Path:
    art = tmp_path / "art"
    shutil.copytree(tiny_llama[1], art)
    return art


@pytest.mark.parametrize(("make", "words"), [
    (larger, ("tokenizer.json has 360 tokens", "vocabulary of 260")),
    (without_specials, ("tokenizer.json has no token 256", "beginning-of-sequence")),
])
def test_a_swapped_tokenizer_with_forged_fingerprint_is_refused_at_load(artifact: Path, make, words) -> None:
    forge(artifact, make())
    with pytest.raises(DamagedArtifactError) as e:
        Generator.load(artifact)
    assert all(w in str(e.value) for w in (*words, "another model", "re-export")), str(e.value)


def test_a_tokenizer_that_gives_an_id_beyond_the_model_is_refused(artifact: Path) -> None:
    forge(artifact, sparse())
    gen = Generator.load(artifact, config=SpecConfig(gamma=0, max_new_tokens=2))
    assert gen.encode("bc")  # ids the model has
    with pytest.raises(DamagedArtifactError, match="gave the token id 1000, outside the model's vocabulary of 260"):
        gen.generate("abc")


def test_tokenizing_a_long_text_lets_other_threads_run(tiny_llama) -> None:  # type: ignore[no-untyped-def]
    """Tokenizing works without the GIL: a thread looping while a long text is encoded (the whole
    path: checks, tokenizer, ids) is never held up for more than a small part of it, as a server's
    event loop must not be. (encode_batch releases the GIL in every tokenizers release; encode()
    did not in all of them.) Both times come from this one run."""
    import threading
    import time

    from specedge.core.manifest import load_manifest
    from specedge.runtime.text.codec import TextCodec

    codec = TextCodec(tiny_llama[1], load_manifest(tiny_llama[1]))
    started, done, took = threading.Event(), threading.Event(), [0.0]

    def tokenize() -> None:
        started.set()
        start = time.perf_counter()
        codec.encode("0123456789 " * 100_000)
        took[0] = time.perf_counter() - start
        done.set()

    worker = threading.Thread(target=tokenize)
    worker.start()
    started.wait()
    last, longest = time.perf_counter(), 0.0
    while not done.is_set():
        now = time.perf_counter()
        last, longest = now, max(longest, now - last)
    worker.join()
    assert longest < took[0] / 4, (longest, took[0])


def test_a_text_too_long_is_refused_by_its_prefix(tiny_llama) -> None:  # type: ignore[no-untyped-def]
    """Past `limit` tokens, a text is refused on its first limit * PREFIX_CHARS characters, not tokenized whole."""
    import pytest

    from specedge.core.manifest import load_manifest
    from specedge.runtime.text.codec import PREFIX_CHARS, PromptTooLong, TextCodec

    codec = TextCodec(tiny_llama[1], load_manifest(tiny_llama[1]))
    with pytest.raises(PromptTooLong) as e:
        codec.encode("7" * 2_000_000, limit=100)
    assert e.value.tokens == 100 * PREFIX_CHARS  # the prefix's tokens (a byte a token), not two million
    assert len(codec.encode("7" * 99, limit=100)) in (99, 100)  # within the limit: every token (BOS or not)
    with pytest.raises(PromptTooLong):  # past it, but too short for the prefix: measured whole
        codec.encode("7" * 150, limit=100)


def test_a_text_too_long_says_its_tokens_and_the_room_it_may_take(tiny_llama) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from specedge.core.manifest import load_manifest
    from specedge.runtime.text.codec import PromptTooLong, TextCodec

    codec = TextCodec(tiny_llama[1], load_manifest(tiny_llama[1]))
    for text in ("7" * 150, "7" * 2_000_000):  # measured whole, and by a prefix
        with pytest.raises(PromptTooLong) as e:
            codec.encode(text, limit=100, what="the message")
        assert (e.value.limit, e.value.fix) == (100, "shorten it")
        assert e.value.problem == f"the message has {e.value.tokens} tokens or more, more than the 100 it may take"


def test_the_text_of_tokens_leaves_out_special_tokens(tiny_llama) -> None:  # type: ignore[no-untyped-def]
    """A reply's text is its tokens' text without the tokenizer's special tokens (chat markers, the
    end of text a reply decoded past with ignore_eos)."""
    from specedge.core.manifest import load_manifest
    from specedge.runtime.text.codec import TextCodec

    codec = TextCodec(tiny_llama[1], load_manifest(tiny_llama[1]))
    text = codec.encode("ab", add_special_tokens=False)
    specials = codec.encode("<|user|><|eos|>", add_special_tokens=False)
    assert len(specials) == 2
    assert codec.decode([*text, *specials, *text]) == "abab"
