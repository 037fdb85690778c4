"""``RolloutBatch``: the padded tensors of one RL step plus per-sample metadata.

Schema (B samples, P = longest prompt, T = longest response). Prompts are left-padded and
responses right-padded, so every response starts at column P of ``input_ids``:

============== ============ =====================================================================
key            shape/dtype  meaning
============== ============ =====================================================================
input_ids      [B, P+T] i64 prompt (left-padded) followed by response (right-padded)
attention_mask [B, P+T] i64 1 on real tokens
position_ids   [B, P+T] i64 positions counted over real tokens only
responses      [B, T] i64   response token ids (pad after the end)
response_mask  [B, T] f32   1 on tokens the loss sees (0 on padding and on tool outputs)
rollout_logprobs [B, T] f32 behaviour log-probs recorded by the rollout engine
old_logprobs   [B, T] f32   log pi_old used in the importance ratio (recomputed or = rollout)
entropy        [B, T] f32   per-token entropy at sampling time (when recorded)
ref_logprobs   [B, T] f32   reference-model log-probs (only with a KL term)
rewards        [B] f32      scalar outcome reward after any shaping
raw_rewards    [B] f32      the verifier's reward before shaping
correct        [B] bool     the verifier's verdict
parsed         [B] bool     an answer could be extracted
group_index    [B] i64      samples of one prompt share a group index (0..n_groups-1)
is_offpolicy   [B] bool     sample was not drawn from pi_old on its training prompt (LOPE's
                            perturbed-prompt rows); its old_logprobs stay the behaviour ones
sampling_temperature [B] f32 temperature the sample was drawn at (nan: not recorded)
truncated      [B] bool     the response hit max_new_tokens
advantages     [B] or [B,T] written by the advantage estimator
============== ============ =====================================================================

Pixel inputs of multimodal prompts are not padded tensors (Qwen2.5-VL's ``pixel_values`` is
[patches, features] with a different patch count per image): they stay on the trajectories
(``Trajectory.mm_inputs``), which every selection and split keeps aligned with the rows, and
:meth:`RolloutBatch.mm_inputs` concatenates them for one model call.

Stages call :meth:`RolloutBatch.require` with the keys they read, so a missing key fails with a
message that names the stage and the key.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch

from harness.types import Trajectory


def _pad_right(rows: list[torch.Tensor | None], width: int) -> torch.Tensor:
    """[len(rows), width] float32, row i = rows[i] followed by zeros (a missing row is zeros)."""
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    lengths = [0 if r is None else len(r) for r in rows]
    present = [r for r in rows if r is not None and len(r)]
    if present:
        mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
        out[mask] = torch.cat(present).float()
    return out


class RolloutBatch:
    def __init__(self, tensors: dict[str, torch.Tensor], trajectories: list[Trajectory]) -> None:
        self.tensors = tensors
        self.trajectories = trajectories

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_trajectories(cls, trajs: Sequence[Trajectory], pad_id: int) -> RolloutBatch:
        """Pad token-in/token-out trajectories into the schema above."""
        trajs = list(trajs)
        B = len(trajs)
        P = max((len(t.prompt_ids) for t in trajs), default=0)
        T = max((len(t.response_ids) for t in trajs), default=0)
        T = max(T, 1)  # keep a response axis even when every response is empty
        # rows are built as Python lists and converted once: per-row tensor slicing costs more
        # than the whole verifier on a tiny-model batch
        ids_rows, attn_rows, mask_rows = [], [], []
        for t in trajs:
            p, r = len(t.prompt_ids), len(t.response_ids)
            ids_rows.append([pad_id] * (P - p) + list(t.prompt_ids) + list(t.response_ids)
                            + [pad_id] * (T - r))
            attn_rows.append([0] * (P - p) + [1] * (p + r) + [0] * (T - r))
            mask = list(t.loss_mask) if t.loss_mask is not None else [1] * r
            mask_rows.append(mask[:r] + [0] * (T - r))
        input_ids = torch.tensor(ids_rows, dtype=torch.long).view(B, P + T)
        attention = torch.tensor(attn_rows, dtype=torch.long).view(B, P + T)
        response_mask = torch.tensor(mask_rows, dtype=torch.float32).view(B, T)
        rollout_lp = _pad_right(
            [t.logprobs[: len(t.response_ids)] if t.logprobs is not None else None for t in trajs],
            T,
        )
        has_entropy = any(t.entropy is not None for t in trajs)
        entropy = _pad_right(
            [t.entropy[: len(t.response_ids)] if t.entropy is not None else None for t in trajs],
            T,
        )
        position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
        scores = [t.score for t in trajs]
        tensors = {
            "input_ids": input_ids,
            "attention_mask": attention,
            "position_ids": position_ids,
            "responses": input_ids[:, P:],
            "response_mask": response_mask,
            "rollout_logprobs": rollout_lp,
            "group_index": torch.as_tensor([t.group_id for t in trajs], dtype=torch.long),
            "is_offpolicy": torch.as_tensor([t.is_offpolicy for t in trajs], dtype=torch.bool),
            "sampling_temperature": torch.as_tensor(
                [math.nan if t.temperature is None else t.temperature for t in trajs],
                dtype=torch.float32),
            "truncated": torch.as_tensor([t.truncated for t in trajs], dtype=torch.bool),
        }
        if has_entropy:
            tensors["entropy"] = entropy
        if all(s is not None for s in scores) and scores:
            rewards = torch.as_tensor([s.reward for s in scores], dtype=torch.float32)
            tensors["rewards"] = rewards
            tensors["raw_rewards"] = rewards.clone()
            tensors["correct"] = torch.as_tensor([s.correct for s in scores], dtype=torch.bool)
            tensors["parsed"] = torch.as_tensor([s.parsed for s in scores], dtype=torch.bool)
        return cls(tensors, trajs)

    @classmethod
    def concat(cls, batches: Sequence[RolloutBatch], pad_id: int) -> RolloutBatch:
        """Concatenate batches, renumbering groups so they stay distinct. The result is rebuilt
        from the trajectories (re-padded to the new widths; their ``group_id`` is rewritten), so
        only trajectory data and the (possibly shaped) rewards carry over: concatenate right
        after rollout, before later stages add keys."""
        trajs: list[Trajectory] = []
        offset = 0
        for b in batches:
            for t, g in zip(b.trajectories, b["group_index"].tolist(), strict=True):
                t.group_id = g + offset
                trajs.append(t)
            offset += b.num_groups
        out = cls.from_trajectories(trajs, pad_id)
        for key in ("rewards", "raw_rewards"):  # keep shaped rewards
            if all(key in b for b in batches) and batches:
                out[key] = torch.cat([b[key] for b in batches])
        return out

    # -- access ---------------------------------------------------------------------------------
    def __getitem__(self, key: str) -> torch.Tensor:
        try:
            return self.tensors[key]
        except KeyError:
            raise KeyError(
                f"RolloutBatch has no key {key!r}; present: {sorted(self.tensors)}"
            ) from None

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        if value.shape[0] != len(self):
            raise ValueError(f"{key!r} has {value.shape[0]} rows, the batch has {len(self)}")
        self.tensors[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self.tensors

    def __len__(self) -> int:
        return len(self.trajectories)

    def require(self, *keys: str, stage: str) -> None:
        missing = [k for k in keys if k not in self.tensors]
        if missing:
            raise KeyError(
                f"stage {stage!r} needs batch keys {missing}, which no earlier stage wrote; "
                f"present: {sorted(self.tensors)}"
            )

    def mm_inputs(self) -> dict[str, torch.Tensor] | None:
        """The rows' pixel inputs for one forward (each key concatenated over the rows that
        have images, in row order), exactly the tensors the rollout engine sampled with; None
        for a text-only batch."""
        from harness.models.multimodal import collate_mm

        return collate_mm([t.mm_inputs for t in self.trajectories])

    @property
    def prompt_length(self) -> int:
        return self.tensors["input_ids"].shape[1] - self.tensors["responses"].shape[1]

    @property
    def num_groups(self) -> int:
        g = self.tensors["group_index"]
        return int(g.max().item()) + 1 if len(g) else 0

    def response_lengths(self) -> torch.Tensor:
        """Tokens the loss sees per sample (tool outputs excluded)."""
        return self.tensors["response_mask"].sum(-1)

    def generated_lengths(self) -> torch.Tensor:
        """Every response-side token per sample, tool outputs included (the length budget)."""
        return self.tensors["attention_mask"][:, self.prompt_length :].sum(-1)

    # -- splitting ------------------------------------------------------------------------------
    def select(self, index: torch.Tensor | Sequence[int]) -> RolloutBatch:
        idx = torch.as_tensor(index, dtype=torch.long)
        tensors = {k: v[idx] for k, v in self.tensors.items()}
        return RolloutBatch(tensors, [self.trajectories[i] for i in idx.tolist()])

    def select_groups(self, groups: Sequence[int]) -> RolloutBatch:
        """Whole groups ``groups`` (in that order), renumbered 0..len(groups)-1.

        Rows are index-selected, so every key (shaped rewards included) survives and an empty
        selection gives a 0-row batch with the same keys. Trajectories are shallow copies with the
        new ``group_id``: the originals still belong to ``self``.
        """
        import dataclasses  # local, so that this method stays the only change to the module

        gi = self.tensors["group_index"]
        order = torch.as_tensor(list(groups), dtype=torch.long)
        if len(set(order.tolist())) != len(order):
            raise ValueError(f"select_groups got repeated groups: {order.tolist()}")
        G = self.num_groups
        if len(order) and (order.min() < 0 or order.max() >= G):
            raise ValueError(f"select_groups: groups must lie in 0..{G - 1}, got {order.tolist()}")
        new_id = torch.full((max(G, 1),), -1, dtype=torch.long)
        new_id[order] = torch.arange(len(order), dtype=torch.long)
        sample_new = new_id[gi] if len(gi) else gi
        keep = torch.nonzero(sample_new >= 0).flatten()
        # Sort by new group id (stable) so the batch lists groups in the requested order.
        keep = keep[torch.sort(sample_new[keep], stable=True).indices]
        out = self.select(keep)
        out.tensors["group_index"] = sample_new[keep].clone()
        out.trajectories = [
            dataclasses.replace(t, group_id=int(g))
            for t, g in zip(out.trajectories, out.tensors["group_index"].tolist(), strict=True)
        ]
        return out

    def split(self, size: int) -> Iterator[RolloutBatch]:
        """Consecutive chunks of ``size`` samples (the last may be smaller)."""
        n = len(self)
        size = max(n, 1) if size <= 0 else size
        for start in range(0, n, size):
            yield self.select(range(start, min(start + size, n)))

    def bucketed_split(self, size: int) -> list[RolloutBatch]:
        """Chunks of ``size`` rows of similar length: rows ordered by response length, then
        prompt length (stable), split, each chunk trimmed to its own longest prompt and response
        (its width is their sum; response lengths vary most within a batch). With a mini-batch
        aggregator the summed loss and gradient are those of :meth:`split` (only padding is left
        out); ``size`` <= 0 or >= the batch is one chunk, unchanged."""
        if size <= 0 or size >= len(self):
            return list(self.split(size))
        attn, P = self.tensors["attention_mask"], self.prompt_length
        key = attn[:, P:].sum(-1) * (P + 1) + attn[:, :P].sum(-1)
        order = torch.argsort(key, stable=True)
        return [chunk.trim_padding() for chunk in self.select(order).split(size)]

    def trim_padding(self) -> RolloutBatch:
        """Drop columns that are padding in every row (left of the prompts, right of the
        responses), so a selection of short samples does not pay for the batch's longest."""
        if len(self) == 0:
            return self
        attn = self.tensors["attention_mask"]
        P = self.prompt_length
        T = attn.shape[1] - P
        real_prompt = attn[:, :P].any(0).nonzero()
        real_resp = attn[:, P:].any(0).nonzero()
        left = int(real_prompt[0]) if len(real_prompt) else P
        keep_T = max(int(real_resp[-1]) + 1 if len(real_resp) else 0, 1)
        tensors = {}
        for key, value in self.tensors.items():
            if value.dim() >= 2 and value.shape[1] == P + T:
                tensors[key] = value[:, left : P + keep_T]
            elif value.dim() >= 2 and value.shape[1] == T:
                tensors[key] = value[:, :keep_T]
            else:
                tensors[key] = value
        return RolloutBatch(tensors, self.trajectories)

    def to(self, device: torch.device | str) -> RolloutBatch:
        return RolloutBatch({k: v.to(device) for k, v in self.tensors.items()}, self.trajectories)
