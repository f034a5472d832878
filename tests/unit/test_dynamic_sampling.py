"""Dynamic sampling's batch surgery: all-equal groups are found and replaced, padding stays right."""

from __future__ import annotations

import pytest

from autoslm.engine.train.dynamic_sampling import informative_groups, merge_groups

pytestmark = pytest.mark.worker  # also runs on the worker image's pins (make test-image)

PAD = 0


@pytest.fixture(scope="module")
def torch():
    """torch, imported by the tests that use it (collecting this module imports none)."""
    import torch

    return torch


def batch(torch, prompt_lens, completion_lens, advantages, tag):
    n = len(advantages)
    lp, lc = max(prompt_lens), max(completion_lens)
    prompt_ids = torch.full((n, lp), PAD)
    prompt_mask = torch.zeros((n, lp), dtype=torch.long)
    completion_ids = torch.full((n, lc), PAD)
    completion_mask = torch.zeros((n, lc), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_lens, completion_lens)):
        prompt_ids[i, lp - p :] = tag  # left-padded
        prompt_mask[i, lp - p :] = 1
        completion_ids[i, :c] = tag  # right-padded
        completion_mask[i, :c] = 1
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages, dtype=torch.float),
        "old_per_token_logps": completion_mask.float() * -1.0,
        "num_items_in_batch": completion_mask.sum(),
    }


def test_informative_groups(torch):
    assert informative_groups(torch.tensor([0.0, 0.0, 0.5, -0.5, 0.0, 0.0]), 2) == [1]


def test_merge_keeps_group_count_and_padding_sides(torch):
    a = batch(torch, [2, 2, 3, 3], [1, 1, 2, 2], [0.0, 0.0, 1.0, -1.0], tag=7)  # group 0 all-equal
    b = batch(torch, [5, 5, 1, 1], [4, 4, 3, 3], [0.5, -0.5, 0.0, 0.0], tag=9)  # group 0 informative
    merged = merge_groups([(a, [1]), (b, [0])], group_size=2, pad_id=PAD)
    assert merged["advantages"].tolist() == [1.0, -1.0, 0.5, -0.5]
    assert merged["prompt_ids"].shape == (4, 5) and merged["completion_ids"].shape == (4, 4)
    # Prompts stay left-padded, completions right-padded, masks follow their tokens.
    assert merged["prompt_ids"][0].tolist() == [0, 0, 7, 7, 7] and merged["prompt_mask"][0].tolist() == [0, 0, 1, 1, 1]
    assert merged["completion_ids"][0].tolist() == [7, 7, 0, 0] and merged["completion_mask"][2].tolist() == [1, 1, 1, 1]
    assert merged["old_per_token_logps"][0].tolist() == [-1.0, -1.0, 0.0, 0.0]
    assert int(merged["num_items_in_batch"]) == 2 + 2 + 4 + 4
