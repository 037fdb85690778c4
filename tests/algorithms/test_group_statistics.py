"""The per-group statistics every advantage estimator is built on (harness/groups.py): group
count, sum, mean, std, max and min, with and without an explicit number of groups, on groups of
one, and the dtype and device of what they return."""

from __future__ import annotations

import pytest
import torch

from harness import groups

IDX = torch.tensor([2, 0, 2, 0, 2])
VALS = torch.tensor([1.0, 4.0, 3.0, 8.0, 8.0])


def test_num_groups_is_the_largest_index_plus_one():
    assert groups.num_groups(torch.tensor([0, 2, 1])) == 3
    assert groups.num_groups(torch.tensor([0])) == 1
    assert groups.num_groups(torch.tensor([], dtype=torch.long)) == 0


def test_group_count_without_g_counts_up_to_the_largest_index():
    assert groups.group_count(IDX).tolist() == [2.0, 0.0, 3.0]


def test_an_explicit_g_keeps_trailing_groups_without_samples():
    G = 5
    assert groups.group_count(IDX, G).tolist() == [2.0, 0.0, 3.0, 0.0, 0.0]
    assert groups.group_sum(VALS, IDX, G).tolist() == [12.0, 0.0, 12.0, 0.0, 0.0]
    assert groups.group_mean(VALS, IDX, G).tolist() == [6.0, 0.0, 4.0, 0.0, 0.0]
    assert groups.group_std(VALS, IDX, "population", G).shape == (G,)
    inf = float("inf")
    assert groups.group_max(VALS, IDX, G).tolist() == [8.0, -inf, 8.0, -inf, -inf]
    assert groups.group_min(VALS, IDX, G).tolist() == [4.0, inf, 1.0, inf, inf]


def test_group_sum_and_mean_without_g():
    assert groups.group_sum(VALS, IDX).tolist() == [12.0, 0.0, 12.0]
    assert groups.group_mean(VALS, IDX).tolist() == [6.0, 0.0, 4.0]


def test_the_mean_of_a_group_of_one_is_its_value():
    assert groups.group_mean(torch.tensor([3.0, 5.0, 7.0]), torch.tensor([0, 1, 1])).tolist() == [
        3.0, 6.0]


def test_group_std_is_unbiased_by_default():
    # group 0: {4, 8} -> unbiased var 8; group 2: {1, 3, 8} -> mean 4, unbiased var 13
    std = groups.group_std(VALS, IDX)
    assert std.tolist() == pytest.approx([8 ** 0.5, 0.0, 13 ** 0.5])


def test_group_std_population_divides_by_n_and_takes_an_explicit_g():
    std = groups.group_std(VALS, IDX, "population", 4)
    assert std.tolist() == pytest.approx([2.0, 0.0, (26 / 3) ** 0.5, 0.0])
    std_u = groups.group_std(VALS, IDX, "unbiased", 4)
    assert std_u.tolist() == pytest.approx([8 ** 0.5, 0.0, 13 ** 0.5, 0.0])


def test_group_std_of_a_group_of_one_is_zero():
    assert groups.group_std(torch.tensor([5.0]), torch.tensor([0])).tolist() == [0.0]


def test_group_std_names_the_valid_kinds_when_given_another():
    with pytest.raises(ValueError, match=r"^std kind 'biased'; valid: unbiased, population$"):
        groups.group_std(VALS, IDX, "biased")


def test_group_max_and_min_without_g():
    assert groups.group_max(VALS, IDX).tolist() == [8.0, float("-inf"), 8.0]
    assert groups.group_min(VALS, IDX).tolist() == [4.0, float("inf"), 1.0]


def test_group_statistics_are_float32_whatever_the_default_dtype():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        half = VALS.half()
        assert groups.group_count(IDX).dtype == torch.float32
        for fn in (groups.group_sum, groups.group_mean, groups.group_max, groups.group_min,
                   groups.group_std):
            assert fn(half, IDX).dtype == torch.float32, fn.__name__
    finally:
        torch.set_default_dtype(old)


def test_group_statistics_stay_on_the_device_of_their_inputs():
    # the meta device stands in for a GPU: a statistic built on the default device fails there
    idx = IDX.to("meta")
    vals = VALS.to("meta")
    assert groups.group_count(idx, 3).device.type == "meta"
    for fn in (groups.group_sum, groups.group_mean, groups.group_max, groups.group_min):
        assert fn(vals, idx, 3).device.type == "meta", fn.__name__
    assert groups.group_std(vals, idx, G=3).device.type == "meta"


def test_gather_broadcasts_each_group_statistic_to_its_samples():
    assert groups.gather(torch.tensor([10.0, 20.0, 30.0]), IDX).tolist() == [30, 10, 30, 10, 30]
