import itertools
import math

import pytest

from harness.evaluation import majority_correct, pass_at_k


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n samples (c correct) containing a correct one."""
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c,k", [(8, 0, 1), (8, 1, 1), (8, 3, 4), (8, 8, 8), (10, 2, 5),
                                   (6, 5, 2), (8, 1, 8)])
def test_pass_at_k_matches_combinatorial_definition(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_1_is_the_fraction_correct():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)


def test_pass_at_k_closed_form():
    assert pass_at_k(20, 4, 5) == pytest.approx(1 - math.comb(16, 5) / math.comb(20, 5))


def test_pass_at_k_needs_k_le_n():
    with pytest.raises(ValueError, match="at least 9 samples"):
        pass_at_k(8, 1, 9)


def test_majority_vote_picks_most_frequent_answer():
    assert majority_correct(["a", "b", "b"], [True, False, False]) is False
    assert majority_correct(["a", "b", "a"], [True, False, True]) is True
    assert majority_correct([None, None], [False, False]) is False
