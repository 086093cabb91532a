"""Matplotlib on machines without a display, and saving a figure: for the benchmark plots and
the tools' pictures. Imported lazily, so matplotlib stays an optional dependency."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    import matplotlib  # optional (the `plots` extra): loaded where a picture is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: str | Path, dpi: int) -> Path:
    """Lay out, write `path` as PNG (creating its folder) and free the figure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path
