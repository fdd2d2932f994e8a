r"""One answer per completion (issue 40, item 7).

Before: a completion was right when either our reading of its answer or math-verify's own
reading matched the gold, so `$7$ or the answer: 3 apples` scored 1.0 against gold 3 and
against gold 7: hedging between candidates was rewarded. Now one reading is scored, chosen
without looking at the gold (`rewards/_reading.py`): math-verify's when math is stated
after our answer, else ours. So no completion is right for two different answers.
"""
from __future__ import annotations

import pytest

from jaxrl_reason.rewards import RewardPool, get_reward
from jaxrl_reason.rewards._reading import final_part, read_alike, stated_after
from jaxrl_reason.rewards.math import extract_answer

# (completion, the one answer it is scored as, by the rule)
HEDGES = [
    ("$7$ or the answer: 3 apples", "3"),  # the issue's: the statement comes last
    ("The answer is 3. Or maybe $7$.", "7"),  # math after the statement
    (r"So $\boxed{3}$ first. The final answer is $7$. I hope", "7"),
    (r"The answer is $\boxed{7}$. Actually the final answer is $3$.", "3"),
    (r"$\boxed{7}$ is wrong; the answer: 3", "7"),  # a lone box reads alike: the box
    ("#### 3\nThe answer is $7$", "7"),
    ("<answer>3</answer> The final answer is $7$", "3"),  # an answer tag reads alike
    ("So $3$, or else the final answer is 7", "7"),
    (r"\(7\) or, the answer is 3.", "3"),
]
# Candidates joined into one answer: a list, right for the list and for neither part.
LISTS = [r"\boxed{3} or \boxed{7}", "Final answer: 3 or 7", "The answer is $3$ or $7$"]


def _scores(completion: str, golds=("3", "7", "3, 7")) -> list[float]:
    reward = get_reward("correctness")
    return [reward(completion, {"answer": gold}).score for gold in golds]


@pytest.mark.parametrize("completion,answer", HEDGES, ids=[h[0][:30] for h in HEDGES])
def test_a_hedging_completion_is_right_for_one_answer(completion, answer):
    three, seven, both = _scores(completion)
    assert three + seven == 1.0, (three, seven)
    assert (three, seven) == ((1.0, 0.0) if answer == "3" else (0.0, 1.0))
    assert both == 0.0


@pytest.mark.parametrize("completion", LISTS)
def test_joined_candidates_are_one_list_answer(completion):
    assert _scores(completion) == [0.0, 0.0, 1.0]


def test_a_batch_scores_hedges_as_the_single_calls_do():
    """The batch path (`correctness_prefetch` in a `RewardPool`) gives the same verdicts."""
    completions = [h for h, _ in HEDGES for _ in range(2)]
    examples = [{"answer": gold} for _ in HEDGES for gold in ("3", "7")]
    with RewardPool({"correctness": 1.0}, num_workers=2) as pool:
        scores = pool.score(completions, examples).components["correctness"].tolist()
    expected = [float(answer == gold) for _, answer in HEDGES for gold in ("3", "7")]
    assert scores == expected


def test_honest_completions_keep_their_verdicts():
    for completion, gold in [(r"The answer is $\boxed{5}$.", "5"),
                             ("We add them: $2+3=5$. The answer is 5", "5"),
                             ("The answer is 5. Indeed $x = 5$.", "5"),
                             (r"So $\boxed{200}$ first. The final answer is $10,455$.", "10455"),
                             ("Work.\n#### 42", "42"), ("The answer is $\\frac{1}{2}$.", "0.5")]:
        assert _scores(completion, (gold,)) == [1.0], completion


def test_math_after_the_answer_is_read_as_math_verify_reads_it():
    """The price of the rule: math stated after a final answer is math-verify's reading
    (here its "answer is ... $...$" anchor takes the check), as with math-verify alone."""
    assert _scores("The answer is 5. Check: $5 \\cdot 2 = 10$.", ("5",)) == [0.0]


def test_the_reading_rule_looks_at_the_text_only():
    final = final_part("The answer is 3. Or maybe $7$.")
    assert extract_answer(final) == "3" and not read_alike(final, "3")
    assert stated_after(final, "3") and not stated_after("$7$ or the answer: 3", "3")
    assert not stated_after(final, "3,7")  # not in the text verbatim: stated last
    assert not stated_after("The answer is 3. I hope it is correct.", "3")
    assert read_alike(r"It is $\boxed{3}$.", "3") and read_alike("<answer>3</answer>", "3")
