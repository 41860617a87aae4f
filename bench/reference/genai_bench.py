"""onnxruntime-genai reference benchmark: plain, draft-model speculative and n-gram decoding.

Runs in its own environment ($GENAI/venv, bench/reference/README.md: $GENAI is any folder outside
this checkout), against int4 CPU models built with the onnxruntime-genai model builder from the
same GGUF checkpoints specedge uses; from the checkout's root:

    $GENAI/venv/bin/python bench/reference/genai_bench.py \
        --target $GENAI/models/qwen2.5-coder-1.5b-instruct-int4 \
        --draft  $GENAI/models/qwen2.5-coder-0.5b-instruct-int4 \
        --out genai_results.json --max-new-tokens 128 --modes plain,draft,ngram

Modes (onnxruntime-genai >= 0.18 Generator API, batch 1, greedy):
  plain  target alone.
  draft  "base speculative decoding": the draft model's decoder block is added as `model.draft`
         to the target's config (a config overlay; no files are written), fixed K = --k
         (`speculative.max_draft_tokens`).
  ngram  n-gram (prompt/history lookup) decoding on the target alone:
         set_speculative_options(ngram_size=--ngram-size, max_draft_tokens=--k).

Each prompt is wrapped in the tokenizer's chat template (og.Tokenizer.apply_chat_template; the
Qwen ChatML default-system string if that fails). Exactly --max-new-tokens tokens are generated:
EOS is suppressed with search option min_length (= max_length), so the counts are fixed; pass
--stop-at-eos to stop at EOS instead. Timing excludes model load and generator creation:
prefill = append_tokens(prompt); decode = the generate_next_token() loop;
decode_tok_s = (new_tokens - 1) / decode_s, e2e_tok_s = new_tokens / (prefill_s + decode_s).
The first new token comes from the prefill's logits: in plain mode the first generate_next_token()
call only samples them (~0.2 ms, no forward pass), so n tokens take n - 1 passes. specedge counts
its decode rate the same way (tokens after the first, over the time after prefill); counting all n
over n - 1 passes would credit genai one free token per prompt (+0.8% at 128 tokens).
One model is loaded at a time (per mode) and each mode is warmed up once before measuring.
Results are rewritten to --out after every prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime_genai as og

PROMPTS = Path(__file__).resolve().parents[1] / "prompts.jsonl"  # the checkout's bench/prompts.jsonl
QWEN_CHATML = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="genai model folder of the target (genai_config.json)")
    p.add_argument("--draft", help="genai model folder of the draft (needed for mode 'draft')")
    p.add_argument("--prompts", default=str(PROMPTS), help="JSONL of {kind, prompt} (default: bench/prompts.jsonl)")
    p.add_argument("--out", required=True)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--modes", default="plain,draft,ngram")
    p.add_argument("--k", type=int, default=4, help="draft tokens per round (max_draft_tokens), draft and ngram modes")
    p.add_argument("--ngram-size", type=int, default=3,
                   help="genai ngram_size N: match the last N-1 tokens (2..16)")
    p.add_argument("--threads", type=int, default=2, help="ORT intra-op threads (0 = ORT default)")
    p.add_argument("--limit", type=int, default=0, help="only the first N prompts (0 = all)")
    p.add_argument("--warmup-tokens", type=int, default=16, help="tokens of one unrecorded warm-up run per mode")
    p.add_argument("--stop-at-eos", action="store_true", help="stop at EOS instead of forcing max-new-tokens")
    return p.parse_args(argv)


def versions():
    out = {"onnxruntime_genai": og.__version__, "python": sys.version.split()[0], "platform": platform.platform()}
    try:
        import onnxruntime as ort  # the ORT that onnxruntime-genai links against (same wheel dependency)
        out["onnxruntime"] = ort.__version__
    except Exception as e:  # pragma: no cover
        out["onnxruntime"] = f"unknown ({e})"
    try:
        from importlib.metadata import version
        out["onnxruntime_genai_dist"] = version("onnxruntime-genai")
    except Exception:
        pass
    out["genai_commit"] = getattr(og, "__commit__", None)
    return out


def session_overlay(threads: int) -> dict:
    return {"intra_op_num_threads": threads} if threads > 0 else {}


def load_model(mode: str, args) -> og.Model:
    """Model for one mode. 'draft' adds the draft decoder as model.draft via a config overlay."""
    cfg = og.Config(str(Path(args.target).resolve()))
    overlay: dict = {"model": {"decoder": {"session_options": session_overlay(args.threads)}}}
    if mode == "draft":
        draft_dir = Path(args.draft).resolve()
        draft_cfg = json.loads((draft_dir / "genai_config.json").read_text())
        target_cfg = json.loads((Path(args.target) / "genai_config.json").read_text())
        if draft_cfg["model"]["vocab_size"] != target_cfg["model"]["vocab_size"]:
            raise SystemExit("target and draft vocab sizes differ")
        block = draft_cfg["model"]["decoder"]
        # genai joins config_path and filename as strings, so the path must be relative to the target.
        block["filename"] = os.path.relpath(draft_dir / block["filename"], Path(args.target).resolve())
        # Target and draft session options must match exactly (same EP list and options).
        block["session_options"] = dict(target_cfg["model"]["decoder"]["session_options"])
        block["session_options"].update(session_overlay(args.threads))
        overlay["model"]["draft"] = block
        overlay["speculative"] = {"max_draft_tokens": args.k}
    cfg.overlay(json.dumps(overlay))
    return og.Model(cfg)


def chat_prompt(tokenizer: og.Tokenizer, prompt: str) -> tuple[str, str]:
    try:
        text = tokenizer.apply_chat_template(json.dumps([{"role": "user", "content": prompt}]),
                                             add_generation_prompt=True)
        if text:
            return text, "tokenizer.apply_chat_template"
    except Exception:
        pass
    return QWEN_CHATML.format(prompt=prompt), "builtin Qwen ChatML"


def generate(model, mode, input_ids, n_new, args):
    n_prompt = len(input_ids)
    params = og.GeneratorParams(model)
    search = {"do_sample": False, "max_length": n_prompt + n_new}
    if not args.stop_at_eos:
        search["min_length"] = n_prompt + n_new  # EOS logits masked until the length is reached
    params.set_search_options(**search)
    if mode == "draft":
        params.set_speculative_options(max_draft_tokens=args.k)
    elif mode == "ngram":
        params.set_speculative_options(ngram_size=args.ngram_size, max_draft_tokens=args.k)
    gen = og.Generator(model, params)

    t0 = time.perf_counter()
    gen.append_tokens(input_ids)  # prefill (target and, in draft mode, the draft)
    t1 = time.perf_counter()
    t_first = None
    while not gen.is_done():
        gen.generate_next_token()
        if t_first is None:
            t_first = time.perf_counter()
    t2 = time.perf_counter()

    seq = np.asarray(gen.get_sequence(0))
    new_ids = [int(x) for x in seq[n_prompt:]]
    stats = None
    if mode in ("draft", "ngram"):
        try:
            stats = {}
            for k, v in gen.get_speculative_stats().items():
                try:
                    json.dumps(v)
                    stats[k] = v
                except TypeError:
                    stats[k] = str(v)
        except Exception as e:
            stats = {"error": str(e)}
    del gen
    return new_ids, t1 - t0, t2 - t1, (t_first - t0) if t_first else None, stats


def summarize(results):
    out = {}
    for mode in dict.fromkeys(r["mode"] for r in results):
        rows = [r for r in results if r["mode"] == mode]
        s = {"prompts": len(rows),
             "new_tokens": sum(r["new_tokens"] for r in rows),
             "decode_tok_s_mean": statistics.mean(r["decode_tok_s"] for r in rows if r["decode_tok_s"]),
             "e2e_tok_s_mean": statistics.mean(r["e2e_tok_s"] for r in rows),
             "decode_tok_s_pooled": sum(r["new_tokens"] - 1 for r in rows) / sum(r["decode_s"] for r in rows),
             "e2e_tok_s_pooled": sum(r["new_tokens"] for r in rows) /
                                 sum(r["prefill_s"] + r["decode_s"] for r in rows)}
        acc = [r["speculative_stats"].get("acceptance_rate") for r in rows
               if isinstance(r.get("speculative_stats"), dict) and "acceptance_rate" in r["speculative_stats"]]
        if acc:
            s["acceptance_rate_mean"] = statistics.mean(acc)
        same = [r["matches_plain"] for r in rows if r.get("matches_plain") is not None]
        if same:
            s["identical_to_plain"] = f"{sum(same)}/{len(same)}"
        out[mode] = s
    return out


def main(argv=None):
    args = parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ("plain", "draft", "ngram"):
            raise SystemExit(f"unknown mode {m!r}")
    if "draft" in modes and not args.draft:
        raise SystemExit("mode 'draft' needs --draft")
    prompts = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    if args.limit:
        prompts = prompts[: args.limit]

    meta = {
        "versions": versions(),
        "threads_intra_op": args.threads if args.threads > 0 else "ORT default",
        "cpu_count": os.cpu_count(),
        "target": str(Path(args.target).resolve()),
        "draft": str(Path(args.draft).resolve()) if args.draft else None,
        "modes": modes, "k": args.k, "ngram_size": args.ngram_size,
        "max_new_tokens": args.max_new_tokens, "ignore_eos": not args.stop_at_eos,
        "decoding": "greedy (do_sample=false), batch 1",
        "prompts_file": str(Path(args.prompts).resolve()), "n_prompts": len(prompts),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_s": {},
    }
    doc = {"meta": meta, "results": [], "summary": {}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        doc["summary"] = summarize(doc["results"]) if doc["results"] else {}
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(out)

    plain_ids: dict[int, list[int]] = {}
    for mode in modes:
        t = time.perf_counter()
        model = load_model(mode, args)
        meta["load_s"][mode] = round(time.perf_counter() - t, 3)
        tokenizer = og.Tokenizer(model)
        encoded = []
        for p in prompts:
            text, src = chat_prompt(tokenizer, p["prompt"])
            meta["chat_template"] = src
            encoded.append(np.asarray(tokenizer.encode(text), dtype=np.int32))
        if args.warmup_tokens > 0 and encoded:
            generate(model, mode, encoded[0], args.warmup_tokens, args)
        for i, (p, ids) in enumerate(zip(prompts, encoded, strict=True)):
            new_ids, prefill_s, decode_s, ttft_s, stats = generate(model, mode, ids, args.max_new_tokens, args)
            n = len(new_ids)
            row = {"index": i, "kind": p.get("kind"), "mode": mode,
                   "prompt_tokens": len(ids), "new_tokens": n,
                   "prefill_s": round(prefill_s, 4), "decode_s": round(decode_s, 4),
                   "ttft_s": round(ttft_s, 4) if ttft_s is not None else None,
                   "decode_tok_s": (n - 1) / decode_s if decode_s > 0 and n > 1 else None,
                   "e2e_tok_s": n / (prefill_s + decode_s),
                   "token_ids": new_ids}
            if mode == "plain":
                plain_ids[i] = new_ids
            elif i in plain_ids:
                ref = plain_ids[i]
                row["matches_plain"] = new_ids == ref
                pairs = enumerate(zip(new_ids, ref, strict=False))
                row["first_divergence"] = next((j for j, (a, b) in pairs if a != b),
                                               None if len(new_ids) == len(ref) else min(len(new_ids), len(ref)))
            if stats is not None:
                row["speculative_stats"] = stats
            doc["results"].append(row)
            save()
            print(f"[{mode}] {i} {p.get('kind')}: {n} tok, prefill {prefill_s:.2f}s ({len(ids)} tok), "
                  f"decode {row['decode_tok_s']:.2f} tok/s, e2e {row['e2e_tok_s']:.2f} tok/s"
                  + (f", acc {stats.get('acceptance_rate')}" if stats and 'acceptance_rate' in stats else ""),
                  flush=True)
        del tokenizer, model
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    save()
    print(json.dumps(doc["summary"], indent=1))


if __name__ == "__main__":
    main()
