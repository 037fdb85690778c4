"""RolloutBatch.from_trajectories: the padded schema every algorithm reads."""

import torch

from harness.batch import RolloutBatch
from harness.types import Score, Trajectory


def traj(prompt, response, group, logprobs=True, entropy=True, loss_mask=None, reward=1.0):
    t = Trajectory(
        prompt_ids=prompt, response_ids=response,
        logprobs=torch.arange(1, len(response) + 1, dtype=torch.float32) if logprobs else None,
        entropy=torch.full((len(response),), 0.5) if entropy else None,
        finish_reason="stop",
    )
    t.group_id, t.loss_mask = group, loss_mask
    t.score = Score(reward=reward, correct=reward == 1.0, parsed=True)
    return t


def test_prompts_are_left_padded_and_responses_right_padded():
    batch = RolloutBatch.from_trajectories(
        [traj([5, 6, 7], [8, 9], 0), traj([5], [8, 9, 10], 0, loss_mask=[1, 0, 1])], pad_id=0
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0], [0, 0, 5, 8, 9, 10]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 4], [0, 0, 0, 1, 2, 3]]
    assert batch["responses"].tolist() == [[8, 9, 0], [8, 9, 10]]
    assert batch["response_mask"].tolist() == [[1, 1, 0], [1, 0, 1]]
    assert batch["rollout_logprobs"].tolist() == [[1, 2, 0], [1, 2, 3]]
    assert batch["entropy"].tolist() == [[0.5, 0.5, 0], [0.5, 0.5, 0.5]]


def test_missing_logprobs_and_empty_responses_become_zeros():
    batch = RolloutBatch.from_trajectories(
        [traj([1, 2], [], 0), traj([1], [3], 1, logprobs=False, entropy=False, reward=0.0)],
        pad_id=0,
    )
    assert batch["responses"].shape == (2, 1)  # a response axis even for empty responses
    assert batch["response_mask"].tolist() == [[0], [1]]
    assert batch["rollout_logprobs"].tolist() == [[0], [0]]
    assert batch["entropy"].tolist() == [[0], [0]]
    assert batch["rewards"].tolist() == [1.0, 0.0] and batch["group_index"].tolist() == [0, 1]


def test_no_entropy_key_when_no_trajectory_recorded_entropy():
    batch = RolloutBatch.from_trajectories([traj([1], [2, 3], 0, entropy=False)], pad_id=0)
    assert "entropy" not in batch.tensors
