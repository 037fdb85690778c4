"""Vectorised per-group statistics over a ``RolloutBatch``'s ``group_index``.

Groups are numbered 0..G-1 but need not be contiguous in the batch (a sample's group is given by
its index, not its position). Every helper returns either a per-group tensor [G] or, through
:func:`gather`, the statistic of each sample's own group [B]. All reductions are scatter/index_add
based, so the cost is O(B) whatever the number or sizes of the groups.
"""

from __future__ import annotations

import torch

STD_KINDS = ("unbiased", "population")


def num_groups(group_index: torch.Tensor) -> int:
    """G = max index + 1 (0 for an empty batch)."""
    return int(group_index.max().item()) + 1 if group_index.numel() else 0


def group_count(group_index: torch.Tensor, G: int | None = None) -> torch.Tensor:
    """Samples per group [G] (float, so it divides directly)."""
    G = num_groups(group_index) if G is None else G
    ones = torch.ones(group_index.shape[0], dtype=torch.float32, device=group_index.device)
    return torch.zeros(G, dtype=torch.float32, device=group_index.device).index_add_(
        0, group_index, ones
    )


def group_sum(
    values: torch.Tensor, group_index: torch.Tensor, G: int | None = None
) -> torch.Tensor:
    """Sum of ``values`` [B] within each group [G]."""
    G = num_groups(group_index) if G is None else G
    values = values.float()
    return torch.zeros(G, dtype=values.dtype, device=values.device).index_add_(
        0, group_index, values
    )


def group_mean(
    values: torch.Tensor, group_index: torch.Tensor, G: int | None = None
) -> torch.Tensor:
    """Mean of ``values`` within each group [G]; an empty group index gets 0."""
    G = num_groups(group_index) if G is None else G
    return group_sum(values, group_index, G) / group_count(group_index, G).clamp(min=1.0)


def group_std(
    values: torch.Tensor,
    group_index: torch.Tensor,
    kind: str = "unbiased",
    G: int | None = None,
) -> torch.Tensor:
    """Standard deviation within each group [G].

    ``unbiased`` divides by n-1 (``torch.std``, as verl), ``population`` by n. A group of one has
    std 0 under both (the unbiased estimate is undefined there; callers that need verl's
    "single sample: std 1" rule apply it themselves with :func:`group_count`).
    """
    if kind not in STD_KINDS:
        raise ValueError(f"std kind {kind!r}; valid: {', '.join(STD_KINDS)}")
    G = num_groups(group_index) if G is None else G
    count = group_count(group_index, G)
    mean = group_mean(values, group_index, G)
    # Two-pass (centre first) for accuracy; the one-pass E[x^2]-E[x]^2 cancels badly.
    centred = values.float() - mean[group_index]
    sq = group_sum(centred.square(), group_index, G)
    denom = (count - 1.0) if kind == "unbiased" else count
    return (sq / denom.clamp(min=1.0)).sqrt()


def group_max(
    values: torch.Tensor, group_index: torch.Tensor, G: int | None = None
) -> torch.Tensor:
    """Maximum of ``values`` within each group [G] (-inf for an index with no samples)."""
    G = num_groups(group_index) if G is None else G
    values = values.float()
    out = torch.full((G,), float("-inf"), dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, group_index, values, reduce="amax", include_self=True)


def group_min(
    values: torch.Tensor, group_index: torch.Tensor, G: int | None = None
) -> torch.Tensor:
    """Minimum of ``values`` within each group [G] (+inf for an index with no samples)."""
    G = num_groups(group_index) if G is None else G
    values = values.float()
    out = torch.full((G,), float("inf"), dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, group_index, values, reduce="amin", include_self=True)


def gather(per_group: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-group statistic [G] back to the samples [B]."""
    return per_group[group_index]
