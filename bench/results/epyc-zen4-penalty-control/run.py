"""What a repetition penalty costs speculation on edits, apart from sampling: the default pair on the
edit prompts of bench/prompts.jsonl under greedy, greedy with repetition_penalty 1.05, and Qwen2.5
instruct's defaults (temperature 0.7, top_k 20, top_p 0.8, repetition_penalty 1.05), plain and default
decoding taking turns prompt by prompt. Usage: python run.py OUT [ROUNDS]"""

import json
import sys
from pathlib import Path

from specedge.bench import SAMPLING_MATRIX, BenchOptions, run_bench
from specedge.defaults import pair_decoding
from specedge.kernels.sampling import SamplingParams
from specedge.options import pair_paths

out, rounds = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3
out.mkdir(parents=True, exist_ok=True)
edits = [line for line in Path("bench/prompts.jsonl").read_text().splitlines() if json.loads(line)["kind"] == "edit"]
prompts = out / "edit-prompts.jsonl"
prompts.write_text("\n".join(edits) + "\n")
settings = [SamplingParams(), *(s for s in SAMPLING_MATRIX if s.penalties.repetition != 1.0)]
target, draft = pair_paths("qwen2.5-coder", None, None)
report = run_bench(target, draft, prompts, out, BenchOptions(
    max_new_tokens=96, only=["default"], default=pair_decoding("qwen2.5-coder"), settings=settings, seed=1,
    rounds=rounds, command="python bench/results/epyc-zen4-penalty-control/run.py " + " ".join(sys.argv[1:])))
print(report.read_text())
