"""γ auto on hand-made acceptance and pass times."""

from specedge.core.contract import gamma_choices
from specedge.export.settings import DEFAULT_WIDTHS
from specedge.kernels.acceptance import expected_tokens
from specedge.runtime.round.gamma import GammaController, Outcome


def observe(ctrl: GammaController, proposed: int, accepted: int, draft_seconds: float, verify_seconds: float,
            source: str = "model", guessed_accepted: int = 0, width: int | None = None, caught_up: int = 0) -> None:
    """A round as the loop reports it (runtime/round/decoding.py's Round.outcome)."""
    ctrl.observe(Outcome(source, proposed, accepted, draft_seconds, verify_seconds, width or proposed + 1,
                         guessed_accepted, caught_up))


def feed(ctrl: GammaController, alpha: float, t_draft: float, t_verify: dict[int, float], rounds: int = 40) -> None:
    for i in range(rounds):
        for width, t in t_verify.items():
            proposed = width - 1
            accepted = round(alpha * proposed) if i % 2 else int(alpha * proposed)
            observe(ctrl, proposed, accepted, t_draft * proposed, t)


def choose(ctrl: GammaController) -> int:
    """The γ of the next round drafted by the model alone."""
    return ctrl.plan(("model",))[1]


def test_gamma_choices_stop_at_the_widest_verification() -> None:
    assert gamma_choices((1, 2, 3, 5, 9, 13, 64)) == (1, 2, 4, 8, 12)
    assert gamma_choices((1, 64)) == ()


def test_expected_tokens() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert abs(expected_tokens(0.5, 2) - 1.75) < 1e-12


def test_high_acceptance_and_cheap_drafts_choose_long_rounds() -> None:
    ctrl = GammaController.for_widths([1, 2, 3, 4, 5, 6, 7, 8, 9, 64])
    assert ctrl.choices == (1, 2, 3, 4, 5, 6, 7, 8) and choose(ctrl) == 4  # nothing measured: start
    feed(ctrl, 0.9, t_draft=0.005, t_verify={1: 0.05, 5: 0.06, 9: 0.07})
    assert choose(ctrl) >= 6


def test_low_acceptance_falls_back_to_plain_and_still_probes() -> None:
    ctrl = GammaController.for_widths([1, 3, 5, 9])
    feed(ctrl, 0.1, t_draft=0.01, t_verify={1: 0.05, 3: 0.08, 5: 0.1})  # drafts would pay at a high acceptance
    choices = [choose(ctrl) for _ in range(16)]
    assert choices.count(0) >= 14 and any(c > 0 for c in choices)  # plain, with a probe now and then


def test_alpha_counts_only_tested_drafts() -> None:
    """Rounds of 4 drafts accepting 4, 4, 0, 4: one rejection in 13 tested drafts, not 4 in 16."""
    ctrl = GammaController(choices=(4,), decay=1.0)
    for accepted in (4, 4, 0, 4):
        observe(ctrl, 4, accepted, 0.01, 0.1)
    alpha = ctrl.stats("model").alpha
    assert abs(alpha - (12 + 2 * 0.7) / (12 + 1 + 2)) < 1e-12
    tokens_per_round = (5 + 5 + 1 + 5) / 4
    assert abs(expected_tokens(alpha, 4) - tokens_per_round) < 0.1  # accepted/proposed: off by 1.0


def test_unmeasured_widths_follow_a_line_through_measured_ones() -> None:
    ctrl = GammaController.for_widths([1, 2, 3, 5])
    observe(ctrl, 0, 0, 0.0, 0.10)
    observe(ctrl, 4, 2, 0.01, 0.18)
    assert abs(ctrl.verify_seconds(3) - 0.14) < 1e-9


def test_each_source_is_judged_on_its_own_record() -> None:
    """Rejected lookups do not make the draft model look bad, nor the other way round."""
    ctrl = GammaController.for_widths(range(1, 10))
    observe(ctrl, 0, 0, 0.0, 0.09)  # a plain step
    for _ in range(30):
        observe(ctrl, 4, 0, 0.0, 0.1, source="ngram")  # lookups always rejected
        observe(ctrl, 4, 4, 0.04, 0.1, source="model")  # the model always accepted
    assert ctrl.stats("ngram").alpha < 0.1 < 0.9 < ctrl.stats("model").alpha
    source, gamma = ctrl.plan(("ngram", "model"))
    assert source == "model" and gamma >= 4
    assert ctrl.plan(("ngram", "model")) == (source, gamma)
    assert ctrl.plan(()) == (None, 0)  # nothing to draft from: a plain step


def test_free_lookups_on_a_flat_cost_curve_take_the_widest_round() -> None:
    """Lookups cost no pass, so with t(13) near t(9) long copies go 12 at a time; the draft
    model's 12 extra steps do not pay at the same acceptance."""
    flat = {1: 0.075, 5: 0.08, 9: 0.085, 13: 0.09}
    lookup, model = GammaController.for_widths(DEFAULT_WIDTHS), GammaController.for_widths(DEFAULT_WIDTHS)
    assert max(lookup.choices) == 12
    feed(lookup, 0.95, t_draft=0.0001, t_verify=flat)
    feed(model, 0.95, t_draft=0.017, t_verify=flat)
    assert choose(lookup) == 12
    assert choose(model) < 12


def test_guesses_accepted_in_plain_steps_count_in_plain_decodings_rate() -> None:
    """Over row pairs a plain step checks a pad-row guess: where those are accepted, plain steps
    yield more than a token each, and a draft source must beat that to be chosen."""
    ctrl = GammaController.for_widths((1, 2, 4, 6, 8))
    observe(ctrl, 1, 1, 0.03, 0.12)  # a γ 1 round: the draft costs as much as a third of a pass
    observe(ctrl, 0, 0, 0.0, 0.10)
    plain = ctrl.rate(0)
    for _ in range(20):
        observe(ctrl, 0, 0, 0.0, 0.10, guessed_accepted=1)
    assert ctrl.rate(0) > 1.8 * plain
    assert ctrl.rate(0) > ctrl.rate(1)  # 2 tokens per 0.10 s beat at most 2 per 0.15 s


def test_shared_passes_take_fewer_drafts_per_stream_as_streams_join() -> None:
    """With RoundCosts of k streams sharing a pass that costs the same up to 8 rows and grows past
    them (2 cores), a stream drafts longer alone than among four, and not at all among eight."""
    from specedge.runtime.streams.pass_curve import PassCurve

    curve = PassCurve()
    for width, seconds in ((1, 0.020), (4, 0.021), (8, 0.024), (16, 0.041), (32, 0.078), (64, 0.16)):
        curve.observe(width, seconds)

    class Costs:
        k = 1

        @property
        def streams(self) -> int:
            return self.k

        def verify_seconds(self, width: int) -> float:
            return curve.seconds(self.k * width) / self.k

    costs = Costs()
    chosen = {}
    for k in (1, 4, 8):
        costs.k = k
        ctrl = GammaController.for_widths([1, 2, 3, 5, 9], costs=costs)
        feed(ctrl, 0.75, t_draft=0.007 / k, t_verify={1: 1.0, 3: 1.0, 5: 1.0})  # own verify times unused
        chosen[k] = choose(ctrl)
    assert chosen[1] > chosen[4] >= 1 and chosen[8] == 0, chosen


def test_shared_costs_with_nothing_measured_yet_fall_back_to_the_streams_own_times() -> None:
    class Unmeasured:
        streams = 2

        def verify_seconds(self, width: int) -> float:
            return 0.0

    ctrl = GammaController.for_widths([1, 2, 3, 5, 9], costs=Unmeasured())
    assert choose(ctrl) == 4  # nothing measured: the start γ
    feed(ctrl, 0.9, t_draft=0.005, t_verify={1: 0.05, 5: 0.06, 9: 0.07})
    assert choose(ctrl) >= 4 and ctrl.rate(0) > 0


def test_the_draft_model_drafts_on_while_its_confidence_pays_for_a_draft() -> None:
    """Another draft pays while confidence x acceptance x a plain step > a draft step + the row it
    adds to the verification; nothing is decided before the costs are measured."""
    ctrl = GammaController.for_widths(DEFAULT_WIDTHS)
    assert ctrl.drafting_rule("model") is None and ctrl.reach == max(ctrl.choices) == 12
    feed(ctrl, alpha=0.8, t_draft=0.3, t_verify={1: 1.0, 2: 1.05, 3: 1.1, 5: 1.2})
    go_on = ctrl.drafting_rule("model")
    assert go_on is not None
    alpha = ctrl.stats("model").alpha
    threshold = (0.3 + 0.05) / (alpha * 1.0)  # a draft step and the 2nd row, over α x a plain step
    assert go_on(1, threshold * 1.01) and not go_on(1, threshold * 0.99)
    assert go_on(1, 0.99) and not go_on(3, 0.3)  # sure: on; unsure after three drafts: stop
    expensive = GammaController.for_widths(DEFAULT_WIDTHS)
    feed(expensive, alpha=0.8, t_draft=0.9, t_verify={1: 1.0, 2: 1.05, 3: 1.1, 5: 1.2})
    assert not expensive.drafting_rule("model")(1, 0.99)  # type: ignore[misc]  # a draft as dear as a step


def test_the_drafting_rule_decides_alike_in_any_unit_of_time() -> None:
    """confidence x acceptance x a plain step against a draft step + the row it adds: times ten
    times shorter (a faster machine) give the same decisions at the same confidences."""
    decisions = []
    for scale in (1.0, 0.1, 0.01):
        ctrl = GammaController.for_widths(DEFAULT_WIDTHS)
        feed(ctrl, alpha=0.8, t_draft=0.3 * scale, t_verify={w: t * scale for w, t in
                                                             {1: 1.0, 2: 1.05, 3: 1.1, 5: 1.2}.items()})
        go_on = ctrl.drafting_rule("model")
        assert go_on is not None
        decisions.append([go_on(n, c) for n in (1, 3) for c in (0.2, 0.4, 0.6, 0.99)])
    assert decisions[0] == decisions[1] == decisions[2] and any(decisions[0]) and not all(decisions[0])



def test_a_drafts_catch_up_after_plain_steps_is_not_charged_to_drafting() -> None:
    ctrl = GammaController.for_widths(DEFAULT_WIDTHS)
    observe(ctrl, 4, 0, draft_seconds=0.04, verify_seconds=0.033)  # 10 ms a draft
    for _ in range(3):  # probes after 8 plain steps: one draft whose pass first fed the 8 tokens
        observe(ctrl, 1, 0, draft_seconds=0.03, verify_seconds=0.03, caught_up=8)
    assert ctrl.stats("model").t_draft == 0.01
    observe(ctrl, 1, 1, draft_seconds=0.02, verify_seconds=0.03, caught_up=1)  # the last draft, after all accepted
    assert abs(ctrl.stats("model").t_draft - 0.013) < 1e-9


def test_the_next_generation_starts_from_what_the_last_one_measured() -> None:
    first = GammaController.for_widths(DEFAULT_WIDTHS)
    feed(first, 0.9, t_draft=0.005, t_verify={1: 0.05, 5: 0.06, 9: 0.07})
    recall = first.recall()
    assert recall.t_verify == first.t_verify and recall.t_draft == {"model": first.stats("model").t_draft}
    fresh, warm = GammaController.for_widths(DEFAULT_WIDTHS), GammaController.for_widths(DEFAULT_WIDTHS, recall=recall)
    assert fresh.plan(("model",)) == ("model", fresh.start)  # nothing measured: the start γ, untimed
    best = max(warm.choices, key=lambda g: warm.rate(g, "model"))  # from the recalled costs, from the first round
    assert warm.plan(("model",)) == ("model", best) and warm.drafting_rule("model") is not None
    assert 0.8 < warm.stats("model").alpha < first.stats("model").alpha  # the prior's pull, weaker than 4 rounds
    for _ in range(4):  # its own rounds soon outweigh the recalled acceptance
        observe(warm, 4, 0, draft_seconds=0.02, verify_seconds=0.06)
    assert warm.stats("model").alpha < 0.5


def test_short_generations_gone_plain_still_probe_across_generations() -> None:
    """An editor's completions of a few tokens each, after one with a low acceptance: each starts
    plain from what the last one measured and ends before probe_every plain rounds; the count
    carries over, so a probe still comes every probe_every plain rounds (never: plain for good)."""
    ctrl = GammaController.for_widths(DEFAULT_WIDTHS)
    feed(ctrl, 0.1, t_draft=0.025, t_verify={1: 0.05, 3: 0.08, 5: 0.1}, rounds=10)  # would pay at a high acceptance
    plans = []
    for _ in range(8):  # 8 generations of 3 rounds, drafts rejected
        ctrl = GammaController.for_widths(DEFAULT_WIDTHS, recall=ctrl.recall())
        for _ in range(3):
            plans.append(gamma := choose(ctrl))
            observe(ctrl, gamma, 0, draft_seconds=0.025 * gamma, verify_seconds=0.05)
    every = ctrl.probe_every
    assert plans[:every - 1] == [0] * (every - 1)  # plain from the recalled low acceptance
    assert all(any(plans[i:i + every]) for i in range(len(plans) - every + 1)), plans  # a probe every 8 rounds


def test_no_probe_where_drafts_would_not_pay_even_if_nearly_all_were_accepted() -> None:
    """Alone, a run gone plain still probes; among streams whose shared plain pass is cheap per
    stream, where a round of drafts would lose even at acceptance 0.9, it does not."""
    class Costs:
        def __init__(self, k: int) -> None:
            self.streams = k

        def verify_seconds(self, width: int) -> float:  # 4 rows cost 1.2 of 1 row, 8 rows 1.7, 12 rows 2.3
            rows = self.streams * width
            return (1.0 + 0.15 * max(rows - 1, 0) ** 1.1) / self.streams

    probes = {}
    for k in (1, 4):
        ctrl = GammaController.for_widths([1, 2, 3, 5, 9], costs=Costs(k))
        feed(ctrl, 0.3, t_draft=0.4, t_verify={1: 1.0, 3: 1.0, 5: 1.0}, rounds=10)  # low acceptance: plain
        probes[k] = sum(choose(ctrl) > 0 for _ in range(64))
    assert probes[1] == 64 // 8 and probes[4] == 0, probes


def test_no_probe_where_the_drafts_catch_up_costs_more_than_its_share_of_a_plain_step() -> None:
    """A probe's draft first feeds every token since the last probe: measured as the draft time its
    drafts' own steps did not take. Over a short context that is cheap and probes go on; over a long
    one (22% of a plain step a token, as the 0.5B draft at 11K tokens) they stop."""
    probes = {}
    for catch_up in (0.02, 0.22):  # seconds a caught-up token, against a plain step of 1 s
        ctrl = GammaController.for_widths(DEFAULT_WIDTHS)
        feed(ctrl, 0.3, t_draft=0.3, t_verify={1: 1.0, 3: 1.5, 5: 1.9}, rounds=10)  # low acceptance: plain
        observe(ctrl, 1, 0, draft_seconds=0.3 + 8 * catch_up, verify_seconds=1.3, caught_up=8)
        assert abs(ctrl.stats("model").t_catch_up - catch_up) < 1e-9 and abs(ctrl.stats("model").t_draft - 0.3) < 1e-9
        probes[catch_up] = sum(choose(ctrl) > 0 for _ in range(64))
    assert probes == {0.02: 64 // 8, 0.22: 0}, probes
