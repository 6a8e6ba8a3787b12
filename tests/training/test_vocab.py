"""Draft-vocabulary calibration: a valid d2t (sorted, in range, round-trips)."""

from __future__ import annotations

from specconvert.training.data import TrainSequence
from specconvert.training.vocab import calibrate, check_d2t


def _seq(ids, mask=None):
    return TrainSequence(list(ids), list(mask if mask is not None else [1] * (len(ids) - 1) + [0]), "text")


def test_most_frequent_trained_tokens_are_kept_and_d2t_round_trips():
    seqs = [_seq([5, 9, 9, 9, 7, 7, 3]), _seq([1, 9, 7, 200, 9])]
    vocab = calibrate(seqs, target_vocab=256, draft_vocab=4, always=[250])
    # trained targets (tokens after a masked position): 9 x4, 7 x3, 3, 200 -> 250 first, then 9, 7, then ties by id (3)
    assert vocab.used == [3, 7, 9, 250]
    assert [i + off for i, off in enumerate(vocab.d2t)] == vocab.used
    assert check_d2t(vocab.d2t, 256) == []
    assert 0 < vocab.coverage < 1  # 200 did not fit
    assert vocab.distinct_trained == 4


def test_fills_up_to_the_requested_size_with_full_coverage():
    vocab = calibrate([_seq([10, 11, 12])], target_vocab=64, draft_vocab=32)
    assert len(vocab.used) == 32 and vocab.used == sorted(set(vocab.used))
    assert all(0 <= t < 64 for t in vocab.used)
    assert {11, 12} <= set(vocab.used)
    assert vocab.coverage == 1.0


def test_masked_positions_are_not_counted():
    seqs = [_seq([1, 2, 3, 4], mask=[0, 0, 1, 0])]  # only token 4 is a training target
    vocab = calibrate(seqs, target_vocab=16, draft_vocab=1)
    assert vocab.used == [4]


def test_check_d2t_finds_out_of_range_and_unsorted():
    assert check_d2t([0, 0, 300], 256) == ["maps outside the target vocabulary"]
    assert check_d2t([5, -1], 256) == ["target ids are not strictly increasing"]
