"""Measure this machine's profile for the default pair, predict plain tokens/s and the speculative
speedup from it, then decode and compare.

    .venv/bin/python scripts/check_profile_prediction.py [--pair qwen2.5-coder] [--gamma 4]
"""

from __future__ import annotations

import argparse
import statistics

from specedge.defaults import pair_artifacts
from specedge.device_profiles.predict import expected_tokens
from specedge.profiling import PROMPTS, measure_device, pass_model, predict_pair
from specedge.runtime import Generator, OnnxModel, SpecConfig
from specedge.runtime.round.drafters import DraftModelDrafter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pair", default="qwen2.5-coder")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    target_dir, draft_dir = pair_artifacts(args.pair)
    profile, path = measure_device(target_dir, draft_dir)
    print(f"profile written to {path}")
    prediction = predict_pair(profile, target_dir, draft_dir, None)
    target = OnnxModel(target_dir)
    roofline = pass_model(target_dir, target.manifest, profile)
    roofline_plain = 1.0 / (roofline.bytes_at(1) / roofline.bandwidth_bytes_per_s)
    point = next(p for p in prediction.points if p.gamma == args.gamma)

    plain = Generator(target, None, SpecConfig(gamma=0, max_new_tokens=args.max_new_tokens))
    spec = Generator(target, DraftModelDrafter(OnnxModel(draft_dir)),
                     SpecConfig(gamma=args.gamma, max_new_tokens=args.max_new_tokens))
    plain_speeds, spec_speeds, ratios = [], [], []
    for prompt in PROMPTS:
        a = plain.generate(prompt, chat=True).stats.tokens_per_s
        b = spec.generate(prompt, chat=True).stats.tokens_per_s
        plain_speeds.append(a)
        spec_speeds.append(b)
        ratios.append(b / a)
    measured_plain = statistics.median(plain_speeds)
    measured_ratio = statistics.median(ratios)
    alpha = prediction.alpha
    print(f"bandwidth {profile.memory_bandwidth_gb_per_s.value:.1f} GB/s, α = {alpha:.2f}, "
          f"E(α,{args.gamma}) = {expected_tokens(alpha, args.gamma):.2f} tokens/round")
    print("| quantity | predicted | measured | error |\n|---|---|---|---|")
    print(f"| plain tokens/s (measured t(1)) | {prediction.plain_tokens_per_s:.1f} | {measured_plain:.1f} | "
          f"{prediction.plain_tokens_per_s / measured_plain - 1:+.0%} |")
    print(f"| plain tokens/s (bandwidth roofline) | {roofline_plain:.1f} | {measured_plain:.1f} | "
          f"{roofline_plain / measured_plain - 1:+.0%} |")
    print(f"| speedup at γ={args.gamma} | {point.speedup:.2f} | {measured_ratio:.2f} | "
          f"{point.speedup / measured_ratio - 1:+.0%} |")
    print(f"recommended γ: {prediction.recommended_gamma}")


if __name__ == "__main__":
    main()
