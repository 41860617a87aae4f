"""What a generation did and how fast: the stable keys scripts rely on."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specedge.runtime.engine.traffic import Traffic

OLD_TOKENS_PER_PASS_KEY = "mean_accepted_per_target_call"  # tokens_per_target_pass's first name, kept in to_dict


@dataclass(frozen=True)
class RoundCounts:
    """A target pass after prefill: `forced` tokens a grammar forced, then `proposed` drafts from
    `source` in a round that asked for γ = `gamma`, `accepted` of them, then `guessed_accepted` of the
    `guessed` pad-row guesses after them, then the target's token."""

    proposed: int
    accepted: int
    gamma: int
    guessed: int = 0
    guessed_accepted: int = 0
    source: str = ""
    forced: int = 0


@dataclass
class GenerationStats:
    n_tokens: int = 0  # generated tokens (EOS excluded)
    prompt_tokens: int = 0
    stop_reason: str = ""  # "eos", "max_new_tokens", "stop_string", "context", "interrupted" (closed early)
    gamma: int = 0  # the γ most rounds asked for (fixed, or chosen by γ auto; 0: plain decoding)
    gamma_auto: bool = False
    gamma_counts: dict[int, int] = field(default_factory=dict)  # γ asked for -> rounds
    # drafts made -> rounds (where the draft model drafts as far as each draft pays, runtime/round/gamma.py, a
    # round may make more or fewer than its γ)
    drafts_counts: dict[int, int] = field(default_factory=dict)
    drafter: str = "none"
    acceptance_rule: str = "greedy"  # how drafts were verified: greedy, race or rejection (runtime/round/decoding.py)
    target_calls: int = 0  # target passes after prefill (plain steps and verifications)
    draft_calls: int = 0  # draft-model passes after prefill
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens accepted
    guessed: int = 0  # prompt-lookup guesses in rows a padded pass runs anyway (runtime/round/decoding.py)
    guessed_accepted: int = 0
    forced: int = 0  # tokens a grammar forced, verified in the passes at no draft cost (runtime/constraints/guide.py)
    produced: int = 0  # tokens made by target passes after prefill (accepted drafts + the target's own)
    drafted_by_source: dict[str, int] = field(default_factory=dict)  # "model", "ngram", "prediction"
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    proposed_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    time_prefill_s: float = 0.0  # prompt passes of target and draft, and the first token
    time_draft_s: float = 0.0
    time_verify_s: float = 0.0  # target passes after prefill, with acceptance
    time_total_s: float = 0.0
    target_traffic: Traffic = field(default_factory=Traffic)  # bytes moved by passes after prefill
    draft_traffic: Traffic = field(default_factory=Traffic)
    bandwidth_gb_per_s: float | None = None  # this machine's measured bandwidth, if profiled

    @property
    def time_decode_s(self) -> float:
        return max(self.time_total_s - self.time_prefill_s, 0.0)

    @property
    def time_host_s(self) -> float:
        """Everything in decoding that is not a model pass: Python, numpy, copies."""
        return max(self.time_decode_s - self.time_draft_s - self.time_verify_s, 0.0)

    @property
    def tokens_per_s(self) -> float:
        """Decoding speed: tokens after the first one, over the time after the first one."""
        if self.n_tokens <= 1 or self.time_decode_s <= 0:
            return 0.0
        return (self.n_tokens - 1) / self.time_decode_s

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        """Tokens produced per target pass after prefill: accepted drafts and guesses + the target's own."""
        return self.produced / self.target_calls if self.target_calls else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        pairs = zip(self.accepted_by_position, self.proposed_by_position, strict=True)
        return [a / p if p else 0.0 for a, p in pairs]

    @property
    def bytes_per_token(self) -> dict[str, float | None]:
        """Bytes moved per generated token after the first (the decoding phase), and how close
        that came to the machine's bandwidth."""
        n = max(self.n_tokens - 1, 1)
        t, d = self.target_traffic, self.draft_traffic
        total = (t.total_bytes + d.total_bytes) / n
        achieved = (t.total_bytes + d.total_bytes) / self.time_decode_s / 1e9 if self.time_decode_s else 0.0
        bw = self.bandwidth_gb_per_s
        return {
            "target_weight_bytes": t.weight_bytes / n,
            "draft_weight_bytes": d.weight_bytes / n,
            "kv_bytes": (t.kv_bytes + d.kv_bytes) / n,
            "logits_bytes": (t.logits_bytes + d.logits_bytes) / n,
            "total_bytes": total,
            "achieved_gb_per_s": achieved,
            "machine_gb_per_s": bw,
            "roofline_tokens_per_s": bw * 1e9 / total if bw and total else None,
            "roofline_fraction": achieved / bw if bw else None,
        }

    def record_round(self, counts: RoundCounts) -> None:
        """A target pass after prefill (runtime/round/decoding.py's Round.counts)."""
        c = counts
        self.forced += c.forced
        if c.proposed:
            self.drafted_by_source[c.source] = self.drafted_by_source.get(c.source, 0) + c.proposed
            self.accepted_by_source[c.source] = self.accepted_by_source.get(c.source, 0) + c.accepted
        self.gamma_counts[c.gamma] = self.gamma_counts.get(c.gamma, 0) + 1
        self.gamma = max(self.gamma_counts, key=lambda g: self.gamma_counts[g])
        self.drafts_counts[c.proposed] = self.drafts_counts.get(c.proposed, 0) + 1
        grow = c.proposed - len(self.proposed_by_position)
        if grow > 0:
            self.proposed_by_position += [0] * grow
            self.accepted_by_position += [0] * grow
        for i in range(c.proposed):
            self.proposed_by_position[i] += 1
            self.accepted_by_position[i] += int(i < c.accepted)
        self.drafted += c.proposed
        self.accepted += c.accepted
        self.guessed += c.guessed
        self.guessed_accepted += c.guessed_accepted
        self.produced += c.forced + c.accepted + c.guessed_accepted + 1
        self.target_calls += 1

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        for name in ("target_traffic", "draft_traffic", "bandwidth_gb_per_s"):
            d.pop(name)
        for name in ("bytes_per_token", "time_decode_s", "time_host_s", "tokens_per_s", "acceptance_rate",
                     "tokens_per_target_pass", "acceptance_by_position"):
            d[name] = getattr(self, name)
        d[OLD_TOKENS_PER_PASS_KEY] = self.tokens_per_target_pass
        return d
