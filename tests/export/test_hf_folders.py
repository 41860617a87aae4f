"""A Hugging Face checkpoint folder as transformers reads it: the end-of-sequence ids that
generation_config.json adds (or config.json's where there is none), and its JSON read as UTF-8
whatever the locale."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from specedge.export.source import load_source
from tests.export.hostile_sources import hf_copy


def test_generation_config_gives_the_end_of_sequence_ids(tiny_llama: tuple[Path, Path, Path],
                                                         tmp_path: Path) -> None:
    """Generation stops at generation_config.json's eos ids (as transformers' generate does); a
    folder without that file stops at config.json's."""
    folder = hf_copy(tiny_llama[0], tmp_path / "more-eos")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [257, 258]}))
    assert set(load_source(folder).eos_token_ids) == {257, 258}
    plain = hf_copy(tiny_llama[0], tmp_path / "no-generation-config", {"eos_token_id": 259})
    (plain / "generation_config.json").unlink()
    assert 259 in load_source(plain).eos_token_ids and 258 not in load_source(plain).eos_token_ids


def test_a_config_with_text_beyond_ascii_reads_under_an_ascii_locale(tiny_llama: tuple[Path, Path, Path],
                                                                     tmp_path: Path) -> None:
    """JSON files are UTF-8: a config.json naming its model in non-ASCII text reads the same under
    the C locale without Python's UTF-8 mode (where open() would decode ASCII)."""
    folder = hf_copy(tiny_llama[0], tmp_path / "named")
    config = {**json.loads((folder / "config.json").read_text(encoding="utf-8")), "_name_or_path": "Zürich/東京-tiny"}
    (folder / "config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    code = ("import locale, sys; from specedge.export.source import load_source; "
            "assert locale.getpreferredencoding(False).lower() in ('ansi_x3.4-1968', 'ascii'), "
            "locale.getpreferredencoding(False); "
            "print(load_source(sys.argv[1]).config.hidden_size)")
    proc = subprocess.run([sys.executable, "-c", code, str(folder)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == load_source(folder).config.hidden_size
