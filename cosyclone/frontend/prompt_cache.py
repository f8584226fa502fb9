"""Prompt-conditioning cache: a speaker used by thousands of rows is encoded once.

A manifest usually reuses a few prompts; without a cache every row re-reads, resamples and runs the
ONNX speech tokenizer and CAM++ on the same audio. The key is the prompt audio's *content* (sha256
of the file bytes, or of an in-memory wave and its rate), never its path, so a renamed copy hits and
an edited file misses; the frontend adds the settings that shape the features. Only successful
results are stored (a bad prompt fails each of its rows with its own row id in the message).

Values are shared between hits, so callers must treat them as read-only; :meth:`Frontend.prepare`
hands each Request its own dict of the (never mutated) tensors, as it did before the cache.
The cache is thread-safe: the pipeline may prepare the next batch on a worker thread.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import torch

from cosyclone.frontend.audio import PromptBytes

__all__ = ["DEFAULT_ENTRIES", "LRUCache", "audio_digest"]

DEFAULT_ENTRIES = 256  # distinct prompts kept; a prompt's features are a few hundred KB at most

V = TypeVar("V")


def audio_digest(prompt_audio: str | Path | PromptBytes | tuple[torch.Tensor, int]) -> str:
    """sha256 of a prompt's content: the file's bytes (read here or shipped), or an in-memory wave's
    float32 samples and rate."""
    h = hashlib.sha256()
    if isinstance(prompt_audio, PromptBytes):  # the same digest as the file it was read from
        h.update(b"file:")
        h.update(prompt_audio.data)
    elif isinstance(prompt_audio, tuple):
        wave, sr = prompt_audio
        arr = np.ascontiguousarray(wave.detach().to(torch.float32).cpu().numpy())
        h.update(f"wave:{int(sr)}:{tuple(arr.shape)}:".encode())
        h.update(arr.tobytes())
    else:
        h.update(b"file:")
        with open(prompt_audio, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


class LRUCache(Generic[V]):
    """A bounded, thread-safe least-recently-used map with hit and miss counters.

    :meth:`get_or_compute` runs ``compute`` outside the lock (ONNX work must not serialize other
    lookups). A key being computed is computed once: a second thread that misses it meanwhile
    waits for the first and takes its value (a hit), or computes it itself when the first raised
    (failures are not stored: each row gets its own error).
    """

    def __init__(self, max_entries: int = DEFAULT_ENTRIES) -> None:
        if max_entries < 0:
            raise ValueError(f"max_entries must be >= 0, not {max_entries}")
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._data: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()
        self._computing: dict[Hashable, threading.Event] = {}  # keys a thread is computing now

    def __len__(self) -> int:
        return len(self._data)

    def get_or_compute(self, key: Hashable, compute: Callable[[], V]) -> V:
        while True:
            with self._lock:
                if key in self._data:
                    self.hits += 1
                    self._data.move_to_end(key)
                    return self._data[key]
                busy = self._computing.get(key) if self.max_entries else None
                if busy is None:
                    self.misses += 1
                    mine = threading.Event()
                    if self.max_entries:
                        self._computing[key] = mine
                    break
            busy.wait()  # another thread computes it: take its value (or compute, if it raised)
        try:
            value = compute()  # an exception stores nothing
            if self.max_entries:
                with self._lock:
                    self._data[key] = value
                    self._data.move_to_end(key)
                    while len(self._data) > self.max_entries:
                        self._data.popitem(last=False)
            return value
        finally:
            with self._lock:
                if self._computing.get(key) is mine:
                    del self._computing[key]
            mine.set()

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "entries": len(self._data)}
