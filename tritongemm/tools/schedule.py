"""`tritongemm schedule`: a picture of which program computes each output tile, in launch order.

Each cell is one BLOCK_M x BLOCK_N tile of C. The number in it is the program that computes it:
its launch order for one-tile-per-program kernels, "program/step" for persistent ones (program p
runs on SM p). The colour is the wave: tiles of one colour are computed at the same time. The
strips on the left (A row-panels) and on top (B column-panels) shade the panels wave 0 reads:
fewer shaded panels for the same number of tiles means more reuse in L2 (see l2.py).

The mapping is `tile_order.schedule`, the Python twin the kernels are tested against. A tile is
one program's: the rungs that split a tile's K across programs (split_k, stream_k, split_tail)
are not drawn, and swap_ab is drawn with K whole (split_k = 1).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from tritongemm.tools import figures
from tritongemm.tools import launch as launch_mod
from tritongemm.tools.launch import Launch

_MAX_LABELLED_TILES = 1600  # above this the numbers are unreadable: colour only
# The rungs drawn (swap_ab with K whole), and those refused, with why.
KERNELS = launch_mod.KERNELS
REFUSED = {
    kernel: f"{why}, which this picture (a tile, one program) does not draw"
    for kernel, why in launch_mod.SPLITS_K.items()
}


def cell_labels(launch: Launch) -> np.ndarray:
    """The text of every cell: launch order, or "program/step" for persistent kernels."""
    s = launch.schedule
    if launch.ordering in ("persistent", "chunked"):
        return np.char.add(np.char.add(s.program.astype(str), "/"), s.step.astype(str))
    return s.order.astype(str)


def draw(launch: Launch, path: str | Path, title: str | None = None) -> Path:
    plt = figures.pyplot()
    from matplotlib.patches import Rectangle  # optional, as figures.pyplot's matplotlib

    m, n = launch.num_pid_m, launch.num_pid_n
    waves = launch.num_waves
    cmap = plt.get_cmap("tab20" if waves <= 20 else "viridis", max(waves, 2))
    cell = min(0.5, 9.0 / max(m, n))  # inches per tile
    width = max(5.5, (n + 1.5) * cell + 1.2)
    fig, ax = plt.subplots(figsize=(width, max(3.5, (m + 1.5) * cell + 1.6)))

    ax.imshow(launch.wave, cmap=cmap, vmin=-0.5, vmax=max(waves, 2) - 0.5, extent=(0, n, m, 0), interpolation="none")
    if m * n <= _MAX_LABELLED_TILES:
        labels = cell_labels(launch)
        size = max(3.0, min(9.0, 72 * cell / (0.6 * max(len(t) for t in labels.ravel()) + 0.6)))
        for (i, j), text in np.ndenumerate(labels):
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=size)
        for x in range(n + 1):
            ax.plot([x, x], [0, m], color="white", linewidth=0.5)
        for y in range(m + 1):
            ax.plot([0, n], [y, y], color="white", linewidth=0.5)

    # The panels of A and B that wave 0 reads.
    rows, cols = launch.tiles_of_wave(0)
    a_read, b_read = set(rows.tolist()), set(cols.tolist())
    for i in range(m):
        ax.add_patch(Rectangle((-1.2, i), 0.9, 1, facecolor=cmap(0) if i in a_read else "#eeeeee", edgecolor="white"))
    for j in range(n):
        ax.add_patch(Rectangle((j, -1.2), 1, 0.9, facecolor=cmap(0) if j in b_read else "#eeeeee", edgecolor="white"))
    ax.text(-0.75, -0.75, "A\\B", ha="center", va="center", fontsize=8)
    ax.set_xlim(-1.3, n)
    ax.set_ylim(m, -1.3)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_visible(False)

    what = "program/step" if launch.ordering in ("persistent", "chunked") else "program (launch order)"
    a0, b0 = len(a_read), len(b_read)
    caption = f"{title or launch.describe()}. Number: {what}; colour: wave; wave 0 ({rows.size} tiles) reads "
    caption += f"{a0} A + {b0} B panels"
    ax.set_title(textwrap.fill(caption, width=int(width * 14)), fontsize=9)
    return figures.save(fig, path, dpi=80)
