"""The training picture: training loss against held-out loss per checkpoint, so memorising shows.

A head that memorises its data has a falling training loss and a flat or rising held-out
loss; the gap between the two curves is what more (and more varied) data closes
(docs/training.md). matplotlib is imported only here, when the picture is written.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence


def loss_curves(history: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Steps, training losses and held-out losses of the checkpoints that have both (NaN dropped)."""
    steps: list[float] = []
    train: list[float] = []
    held: list[float] = []
    for row in history:
        a, b = row.get("train_loss"), row.get("heldout_loss")
        if a is None or b is None or not math.isfinite(a) or not math.isfinite(b):
            continue
        steps.append(row["step"])
        train.append(a)
        held.append(b)
    return {"step": steps, "train_loss": train, "heldout_loss": held}


def write_loss_plot(history: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Write the loss picture to ``path`` (PNG); None when the history has no point to draw."""
    curves = loss_curves(history)
    if not curves["step"]:
        return None
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(curves["step"], curves["train_loss"], "o-", label="training loss")
    ax.plot(curves["step"], curves["heldout_loss"], "s--", label="held-out loss")
    gap = curves["heldout_loss"][-1] - curves["train_loss"][-1]
    ax.set_xlabel("step")
    ax.set_ylabel("EAGLE-3 loss")
    ax.set_title(f"draft head training (final held-out - train gap {gap:+.2f})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
