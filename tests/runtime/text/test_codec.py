"""A streamed answer is the whole answer: the pieces StreamDecoder gives, joined, are the text the
tokenizer decodes from all the ids at once, whatever the tokens between them (special tokens the
decode skips, a SentencePiece tokenizer's word-start spaces)."""

from __future__ import annotations

from types import SimpleNamespace

from tokenizers import Tokenizer, decoders, models

from specedge.runtime.text.codec import StreamDecoder


def test_pieces_joined_are_the_whole_text_across_a_skipped_special_token() -> None:
    tok = Tokenizer(models.WordLevel({"▁Hello": 0, "▁world": 1, "!": 2, "[UNK]": 3}, unk_token="[UNK]"))
    tok.decoder = decoders.Metaspace()  # "▁" is a space, dropped at the start of the text
    special = tok.add_special_tokens(["<|tool|>"]) and tok.token_to_id("<|tool|>")
    codec = SimpleNamespace(decode=lambda ids: tok.decode(list(ids), skip_special_tokens=True))
    for ids in ([0, special, 1, 2], [0, special, special, 1], [special, 0, 1]):
        stream = StreamDecoder(codec)  # type: ignore[arg-type]
        pieces = [stream.push([i]) for i in ids]
        assert "".join(pieces) + stream.flush() == tok.decode(ids, skip_special_tokens=True), ids
