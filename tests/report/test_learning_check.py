"""The board's learning check: on how many seeds the baseline's final pass@1 is above its step-0
evaluation, and which seeds are not (issues 35, 36: a testbed whose baseline does not learn
cannot show a method improving on it)."""

from __future__ import annotations

from harness.report.tables import Row, Run, Spec, learning_check

SPEC = Spec("heldout", "pass", 1)
KEY = SPEC.name


def _row(label: str, finals: dict[str, float], starts: dict[str, float],
         baseline: str = "") -> Row:
    runs = {s: Run(f"{label}-{s}", label, "", s, "1.0", baseline,
                   {f"final/{KEY}": f, **({f"start/{KEY}": starts[s]} if s in starts else {})})
            for s, f in finals.items()}
    return Row(key=label, label=label, algorithm=label, variant="", temperature="1.0",
               runs=runs, baseline=baseline)


def test_the_seeds_where_the_baseline_does_not_improve_are_named_with_their_change() -> None:
    grpo = _row("grpo", {"0": 0.70, "1": 0.80, "2": 0.75, "10": 0.60},
                {"0": 0.72, "1": 0.75, "2": 0.75, "10": 0.50})
    lines = learning_check([_row("arpo", {"0": 0.7}, {"0": 0.7}, "grpo"), grpo], [SPEC])
    # a tie is not an improvement; seeds in numeric order
    assert lines == ["", "- Learning check: baseline `grpo`, heldout pass@1: above its step-0 "
                         "value on 2 of 4 seeds; not on seeds 0 (-0.020), 2 (+0.000)."]


def test_a_baseline_that_improves_on_every_seed_says_so() -> None:
    grpo = _row("grpo", {"0": 0.8, "1": 0.9}, {"0": 0.7, "1": 0.7})
    lines = learning_check([grpo, _row("dapo", {"0": 0.9}, {}, "grpo")], [SPEC])
    assert lines[-1].endswith("above its step-0 value on 2 of 2 seeds (every seed).")


def test_only_rows_that_are_a_baseline_and_only_pass_at_1_are_checked() -> None:
    grpo = _row("grpo", {"0": 0.8}, {"0": 0.7})
    other = _row("rloo", {"0": 0.1}, {"0": 0.7})  # worse, but no row's baseline
    pass8 = Spec("heldout", "pass", 8)
    lines = learning_check([grpo, other, _row("x", {"0": 0.8}, {"0": 0.7}, "grpo")], [SPEC])
    assert len(lines) == 2 and "`grpo`" in lines[1]
    lines = learning_check([grpo, _row("x", {"0": 0.8}, {"0": 0.7}, "grpo")], [SPEC, pass8])
    assert len(lines) == 2 and "`grpo`, heldout pass@1" in lines[1]


def test_a_baseline_without_a_step_0_evaluation_is_not_checked() -> None:
    grpo = _row("grpo", {"0": 0.8}, {})
    lines = learning_check([grpo, _row("x", {"0": 0.8}, {}, "grpo")], [SPEC])
    assert "no step-0 evaluation, not checked" in lines[1]


def test_on_a_board_without_pairings_every_row_is_checked() -> None:
    lines = learning_check([_row("grpo", {"0": 0.8}, {"0": 0.7}),
                            _row("rloo", {"0": 0.6}, {"0": 0.7})], [SPEC])
    assert [ln.split("`")[1] for ln in lines[1:]] == ["grpo", "rloo"]
    assert lines[2].endswith("on 0 of 1 seeds; not on seed 0 (-0.100).")


def test_the_seeds_that_do_not_improve_are_listed_in_numeric_order() -> None:
    grpo = _row("grpo", {"10": 0.5, "2": 0.5, "1": 0.9}, {"10": 0.6, "2": 0.7, "1": 0.7})
    assert learning_check([grpo], [SPEC])[1].endswith("not on seeds 2 (-0.200), 10 (-0.100).")


def test_a_row_without_a_step_0_evaluation_has_that_one_line_only() -> None:
    assert learning_check([_row("grpo", {"0": 0.8}, {})], [SPEC]) == [
        "", "- Learning check: baseline `grpo`, heldout pass@1: no step-0 evaluation, not "
            "checked (`trainer.eval_at_start`)."]


def test_a_board_without_pass_at_1_has_no_learning_check_lines() -> None:
    grpo = _row("grpo", {"0": 0.8}, {"0": 0.7})
    assert learning_check([grpo], [Spec("heldout", "pass", 8)]) == []


def test_a_seed_without_a_final_or_step_0_value_is_named_and_not_every_seed() -> None:
    grpo = _row("grpo", {"0": 0.8, "1": float("nan"), "2": 0.9}, {"0": 0.7, "1": 0.7})
    assert learning_check([grpo], [SPEC])[1].endswith(
        "above its step-0 value on 1 of 3 seeds; seeds 1, 2 not checked (no final or step-0 "
        "value).")
