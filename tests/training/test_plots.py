"""The training picture: training loss against held-out loss, so memorising shows."""

from __future__ import annotations

import math

from specconvert.training.plots import loss_curves, write_loss_plot


def test_loss_curves_keep_checkpoints_that_have_both_losses():
    history = [
        {"step": 10, "train_loss": 6.0, "heldout_loss": 7.0},
        {"step": 20, "train_loss": float("nan"), "heldout_loss": 7.5},  # the final row of a run stopped at once
        {"step": 30, "train_loss": 5.0, "heldout_loss": 9.0},
    ]
    assert loss_curves(history) == {"step": [10, 30], "train_loss": [6.0, 5.0], "heldout_loss": [7.0, 9.0]}


def test_write_loss_plot_writes_a_png_and_nothing_for_an_empty_history(tmp_path):
    assert write_loss_plot([], tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()
    path = write_loss_plot([{"step": 1, "train_loss": 5.1, "heldout_loss": 11.3}], tmp_path / "loss.png")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not math.isnan(loss_curves([{"step": 1, "train_loss": 5.1, "heldout_loss": 11.3}])["train_loss"][0])
