"""The schematic timeline of one SM running rung 9 (docs/warp-specialization.md): what the load
warp, the ring's slots, the MMA warpgroup and the TMA store do, step by step, from the kernel's
protocol (a slot is refilled once the MMA that read it has retired; the MMA of a step starts when
its slot is loaded and the previous MMA was issued; the epilogue follows a tile's last step).
Durations are illustrative, not measured: python3 scripts/ci/ws_timeline.py [out.png]
"""

import sys

from tritongemm.tools import figures

NUM_BUFFERS, STEPS_PER_TILE, TILES = 4, 6, 3
LOAD, MMA, EPILOGUE, STORE = 3.0, 1.0, 2.5, 2.0  # time units


def simulate():
    """(loads, mmas, epilogues, stores): lists of (start, end, step or tile)."""
    loads, mmas, epilogues, stores = [], [], [], []
    retired = {}  # step -> when its MMA retired (one MMA stays in flight: step i retires when i + 1 is issued)
    mma_free = 0.0  # when the MMA warpgroup can issue again
    issue = 0.0  # the load warp's clock
    total = STEPS_PER_TILE * TILES
    # Both partitions, step by step in time order: the load warp issues step i once its slot's
    # previous step (i - NUM_BUFFERS) has retired; the MMA of step i once it has landed.
    for step in range(total):
        slot_free = retired.get(step - NUM_BUFFERS, 0.0) if step >= NUM_BUFFERS else 0.0
        start = max(issue, slot_free)
        loads.append((start, start + LOAD, step))
        issue = start + 0.2  # issuing is quick; the copy runs in the TMA engine
        begin = max(start + LOAD, mma_free)
        mmas.append((begin, begin + MMA, step))
        mma_free = begin + MMA
        if step % STEPS_PER_TILE:  # wait(1) after issuing `step`: `step - 1` has retired (a tile's
            retired[step - 1] = begin  # last step is released before its epilogue, below)
        if step % STEPS_PER_TILE == STEPS_PER_TILE - 1:  # the tile's last step: drain, epilogue, store
            retired[step] = mma_free
            tile = step // STEPS_PER_TILE
            epilogues.append((mma_free, mma_free + EPILOGUE, tile))
            stores.append((mma_free + EPILOGUE, mma_free + EPILOGUE + STORE, tile))
            mma_free += EPILOGUE
    return loads, mmas, epilogues, stores


def draw(path: str) -> None:
    plt = figures.pyplot()
    loads, mmas, epilogues, stores = simulate()
    fig, ax = plt.subplots(figsize=(11, 3.6))
    colors = plt.get_cmap("tab10")
    rows = {"TMA store (MMA warps issue it)": 0, "MMA warpgroup: epilogue": 1, "MMA warpgroup: WGMMA": 2}
    for s in range(NUM_BUFFERS):
        rows[f"ring slot {s}: load in flight"] = 3 + s
    for start, end, step in loads:
        tile = step // STEPS_PER_TILE
        ax.barh(3 + step % NUM_BUFFERS, end - start, left=start, color=colors(tile), alpha=0.45, edgecolor="black")
        label = f"k{step % STEPS_PER_TILE}"
        ax.text((start + end) / 2, 3 + step % NUM_BUFFERS, label, ha="center", va="center", fontsize=7)
    for start, end, step in mmas:
        ax.barh(2, end - start, left=start, color=colors(step // STEPS_PER_TILE), edgecolor="black")
    for start, end, tile in epilogues:
        ax.barh(1, end - start, left=start, color=colors(tile), hatch="//", edgecolor="black")
        ax.text((start + end) / 2, 1, f"tile {tile}", ha="center", va="center", fontsize=8)
    for start, end, tile in stores:
        ax.barh(0, end - start, left=start, color=colors(tile), alpha=0.6, edgecolor="black")
    ax.set_yticks(list(rows.values()))
    ax.set_yticklabels(list(rows.keys()), fontsize=8)
    ax.set_xlabel("time (schematic units, not measured)")
    ax.set_title(
        f"Rung 9 on one SM ({NUM_BUFFERS} ring slots, {STEPS_PER_TILE} K-steps a tile): the load warp refills a slot\n"
        "once the MMA that read it retires, so tile t + 1's first loads land during tile t's epilogue",
        fontsize=9,
    )
    ax.grid(axis="x", alpha=0.3)
    figures.save(fig, path, dpi=110)


if __name__ == "__main__":
    draw(sys.argv[1] if len(sys.argv) > 1 else "docs/img/ws-timeline.png")
