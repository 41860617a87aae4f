"""Hugging Face names for online users: `hf:OWNER/REPO[:TAG]` is a repository on the Hub holding GGUF
files (TAG picks one by its quantization, as llama.cpp's `-hf` does: `:Q4_K_M`) or a safetensors
checkpoint, fetched through huggingface_hub (its progress bars, its cache, its token) and then
exported as any local source is. Offline (HF_HUB_OFFLINE=1), a repository already in the Hub's
cache is used from there, and one that is not is one line saying so.

Only data is fetched: GGUF files, or a checkpoint's safetensors and JSON and tokenizer files -
never pickled weights or code, which nothing here would run anyway.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from specedge.core.errors import SpecEdgeError

PREFIX = "hf:"
CHECKPOINT_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.txt"]
PREFERRED_TAGS = ("q4_k_m", "q4_0", "q8_0")  # llama.cpp's default first, where a repository has several
SPLIT_GGUF = re.compile(r"-\d{5}-of-\d{5}\.gguf$")
REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_name(text: str) -> bool:
    return text.startswith(PREFIX)


def hub_source(text: str) -> Path:
    """The local GGUF file or checkpoint folder of `hf:OWNER/REPO[:TAG]`, downloaded if need be."""
    repo, _, tag = text[len(PREFIX):].partition(":")
    if not REPO.match(repo):
        raise SpecEdgeError(f"'{text}' is not a Hugging Face name", "write it as hf:OWNER/REPO or hf:OWNER/REPO:Q4_K_M")
    try:
        import huggingface_hub
        from huggingface_hub import constants
    except ImportError:
        raise SpecEdgeError("hf: names need huggingface_hub", "pip install huggingface_hub") from None
    offline = bool(constants.HF_HUB_OFFLINE)
    try:
        files = repo_files(huggingface_hub, repo, offline)
        ggufs = [f for f in files if f.endswith(".gguf")]
        if ggufs:
            name = pick_gguf(repo, ggufs, tag)
            return Path(huggingface_hub.hf_hub_download(repo, name, local_files_only=offline))
        if tag:
            raise SpecEdgeError(f"hf:{repo} has no GGUF files for ':{tag}' to pick from",
                                f"drop ':{tag}' to export its checkpoint")
        if "config.json" in files and any(f.endswith(".safetensors") for f in files):
            return Path(huggingface_hub.snapshot_download(repo, allow_patterns=CHECKPOINT_FILES,
                                                          local_files_only=offline))
    except SpecEdgeError:
        raise
    except Exception as e:  # huggingface_hub's own errors: not found, gated, offline, no network
        raise hub_error(repo, offline, e) from None
    raise SpecEdgeError(f"hf:{repo} holds neither a GGUF file nor a safetensors checkpoint",
                        "pick a repository with .gguf files, or config.json and .safetensors")


def hub_artifact(text: str, context: int | None = None) -> Path:
    """The cached export of `hf:OWNER/REPO[:TAG]`, fetched and exported on first use."""
    from specedge.resolve import source_artifact

    return source_artifact(hub_source(text), hub_label(text), context)


def hub_label(text: str) -> str:
    """The name an `hf:` source's export is cached under: OWNER--REPO (and its tag)."""
    repo, _, tag = text[len(PREFIX):].partition(":")
    return repo.replace("/", "--") + (f"-{tag}" if tag else "")


def repo_files(hub: object, repo: str, offline: bool) -> list[str]:
    """The repository's file names: listed by the Hub, or offline those of its cached snapshot."""
    if not offline:
        return list(hub.list_repo_files(repo))  # type: ignore[attr-defined]
    folder = Path(hub.snapshot_download(repo, local_files_only=True))  # type: ignore[attr-defined]
    return [str(PurePosixPath(p.relative_to(folder))) for p in folder.rglob("*") if p.is_file()]


def pick_gguf(repo: str, ggufs: list[str], tag: str) -> str:
    """The GGUF file TAG names (case-insensitive, in its file name), else the only one, else llama.cpp's
    default quantization where there is one; several parts of one model (split files) are refused."""
    whole = [f for f in ggufs if not SPLIT_GGUF.search(f)]
    tags = ", ".join(sorted({gguf_tag(f) for f in whole})) or "none"
    if tag:
        chosen = [f for f in whole if tag.lower() in PurePosixPath(f).name.lower()]
        if len(chosen) == 1:
            return chosen[0]
        what = "no" if not chosen else "several"
        raise SpecEdgeError(f"hf:{repo} has {what} GGUF files for ':{tag}' (its files: {tags})",
                            f"name one as hf:{repo}:TAG")
    if len(whole) == 1:
        return whole[0]
    for preferred in PREFERRED_TAGS:
        chosen = [f for f in whole if preferred in PurePosixPath(f).name.lower()]
        if len(chosen) == 1:
            return chosen[0]
    if not whole:
        raise SpecEdgeError(f"hf:{repo} has only split GGUF files (several parts of one model)",
                            "merge them with llama.cpp's gguf-split --merge, and pass the merged file")
    raise SpecEdgeError(f"hf:{repo} has several GGUF files ({tags})", f"name one as hf:{repo}:TAG")


def gguf_tag(name: str) -> str:
    """A GGUF file's quantization as its name says (Q4_K_M), else its name."""
    stem = PurePosixPath(name).stem
    match = re.search(r"(?i)(iq\d\w*|q\d(_\w+)?|bf16|f16|f32)$", stem)
    return match.group(1).upper() if match else stem


def hub_error(repo: str, offline: bool, e: Exception) -> SpecEdgeError:
    kind = type(e).__name__
    if offline or kind == "LocalEntryNotFoundError":
        return SpecEdgeError(f"hf:{repo} is not in the Hugging Face cache, and downloads are off "
                             "(HF_HUB_OFFLINE)", "fetch it once online, or pass a local GGUF file or folder")
    if kind in ("RepositoryNotFoundError", "GatedRepoError"):
        return SpecEdgeError(f"hf:{repo} was not found on the Hub, or needs a login ({kind})",
                             "check the name; for a gated model, `hf auth login` first")
    first = str(e).splitlines()[0][:160] if str(e) else kind
    return SpecEdgeError(f"hf:{repo} could not be fetched ({first})", "check the network connection and the name")
