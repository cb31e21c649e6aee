"""Plots without a display: matplotlib on the Agg backend, and PNG files written atomically."""

from __future__ import annotations

import os
from pathlib import Path

from difftransformer.storage import atomic_write


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure, path: str | os.PathLike) -> Path:
    """Save a matplotlib figure as PNG atomically and close it."""
    import matplotlib.pyplot as plt

    figure.tight_layout()
    try:
        return atomic_write(
            path, lambda handle: figure.savefig(handle, format="png", dpi=120, bbox_inches="tight")
        )
    finally:
        plt.close(figure)
