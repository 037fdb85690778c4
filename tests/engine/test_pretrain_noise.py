"""Warm-start noise prefixes (model.pretrain.prefix_words): off by default, seeded, text prompts
only, completions untouched."""

from __future__ import annotations

from types import SimpleNamespace

from harness.models.pretrain import with_noise_prefixes
from harness.types import Example


def cfg(**kw):
    base = {"prefix_words": ["lorem", "ipsum"], "prefix_fraction": 0.5, "prefix_max_words": 3,
            "prefix_separator": " ", "seed": 0}
    return SimpleNamespace(**{**base, **kw})


PAIRS = [(Example(str(i), f"{i} 2 3=6:"), "1+2+3") for i in range(400)]


def test_no_words_means_no_change():
    assert with_noise_prefixes(PAIRS, cfg(prefix_words=[])) is PAIRS


def test_a_seeded_share_of_text_prompts_gets_one_to_three_words():
    out = with_noise_prefixes(PAIRS, cfg())
    assert out == with_noise_prefixes(PAIRS, cfg())  # seeded
    changed = [(a, b) for a, b in zip(PAIRS, out) if a[0].prompt != b[0].prompt]
    assert 150 < len(changed) < 250  # about half of 400
    for (orig, completion), (new, new_completion) in changed:
        prefix, rest = new.prompt[: -len(orig.prompt) - 1], new.prompt[-len(orig.prompt):]
        assert rest == orig.prompt and new_completion == completion
        assert 1 <= len(prefix.split(" ")) <= 3 and set(prefix.split(" ")) <= {"lorem", "ipsum"}
    chat = [(Example("c", [{"role": "user", "content": "q"}]), "a")]
    assert with_noise_prefixes(chat, cfg(prefix_fraction=1.0)) == chat
