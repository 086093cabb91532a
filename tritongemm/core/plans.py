"""The plan cache: what a call needs that depends only on its problem, built once and kept.

Every family's first call for a problem checks it, chooses a kernel and config, decides copies
and compiles; what that builds (a `dense.plan.Plan`, a linear call, an fp8 or grouped launcher)
goes into one bounded LRU cache under a key of every fact those steps read (`problem.tensor_facts`
of each tensor, and each argument as given), and every later call with that key runs it. On a hit
nothing is checked, chosen or compiled again: a problem that differs in any fact misses.

    call = planned(key, lambda: build(...))   # the one idiom: find, or build and remember

One cache for every family, so that one bound and one `clear` cover them all.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

# A problem is a geometry, not a pointer: a training step or a decoder has a few dozen (each
# `linear` problem holds two entries: its GEMM's plan and its call, dense.linear.LinearCall). 512
# keeps every plan of a large model's layers, for several batch sizes, and bounds a shape-sweeping
# program's memory; a miss costs one plan build (checks and a descriptor build, no recompile).
CAPACITY = 512

T = TypeVar("T")


class PlanCache:
    """A bounded, thread-safe LRU map from problem keys to plans."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self._plans: OrderedDict[tuple, object] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0
        # How many times `clear` ran: what holds a plan outside the cache (a compiled graph's call
        # site, inductor.Site) drops it when this moves, as the cache itself did.
        self.generation = 0

    def planned(self, key: tuple | None, build: Callable[[], T]) -> T:
        """The value kept under `key`, or `build()`'s, then kept (unless None: an empty problem has no
        plan). Where the call's facts can't be read (`key` None: not tensors) or hashed (a config of
        the wrong type), `build` runs uncached, and its checks say what is wrong. It runs outside the
        lock: a build may compile for seconds (two threads that miss at once both build the plan)."""
        if key is not None:
            try:
                value = self.find(key)
            except TypeError:  # unhashable: hashing is the check, so a hit costs one hash
                key = value = None
            if value is not None:
                return value
        value = build()
        if key is not None and value is not None:
            self.remember(key, value)
        return value

    def find(self, key: tuple):
        """What `remember` keeps under `key`, else None."""
        with self._lock:
            value = self._plans.get(key)
            if value is not None:
                self._plans.move_to_end(key)
                self.hits += 1
            return value

    def remember(self, key: tuple, value) -> None:
        """Keep `value` under `key`, the least recently used entry going when the cache is full."""
        with self._lock:
            self.misses += 1
            self._plans[key] = value
            self._plans.move_to_end(key)
            while len(self._plans) > self.capacity:
                self._plans.popitem(last=False)
                self.evictions += 1

    def info(self) -> dict:
        with self._lock:
            return dict(size=len(self._plans), capacity=self.capacity, hits=self.hits, misses=self.misses,
                        evictions=self.evictions)  # fmt: skip

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
            self.hits = self.misses = self.evictions = 0
            self.generation += 1


PLANS = PlanCache()
planned = PLANS.planned
