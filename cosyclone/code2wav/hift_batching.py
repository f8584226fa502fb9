"""HiFT over a batch of rows: length-sorted chunks of padded frames, side by side on CPU threads.

Why apart from the generator (:mod:`.hift`): the generator computes one padded batch, exactly (a
row equals the row run alone); how a batch of rows is cut into such calls is a separate decision.
It is made from the rows' lengths alone, so the bytes never depend on the thread count (a row's
chunk decides its padded GEMM shapes), against a frame budget (CPU: the cache; accelerators: the
engine's sizing), and the worker threads that run chunks side by side are a matter of torch's CPU
threading, not of the vocoder. The flow's counterpart is
:func:`cosyclone.code2wav.token2wav.run_flow`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import torch
from torch import Tensor

from cosyclone.base.batching import chunks_by_length


class PaddedBatchVocoder(Protocol):
    """What :func:`vocode_in_chunks` needs of a vocoder
    (:class:`~cosyclone.code2wav.hift.CausalHiFTGenerator`)."""

    upsample_scale: int  # output samples per mel frame

    def padded_batch(self, mel: Tensor, mel_len: Tensor) -> tuple[Tensor, Tensor]:
        """mel (B, 80, T), mel_len (B,) -> wav (B, upsample_scale·T) zero past each row, wav_len (B,)."""
        ...

    def reserve_noise(self, samples: int) -> None:
        """Hold the source noise for ``samples`` output samples now (not grown by racing workers)."""
        ...


def vocode_in_chunks(vocoder: PaddedBatchVocoder, mel: Tensor, mel_len: Tensor, *, max_frames: int,
                     bucket: int = 0) -> tuple[Tensor, Tensor]:
    """mel (B, 80, T), mel_len (B,) -> wav (B, upsample_scale·T) zero beyond each row, wav_len (B,).

    Rows run in length-sorted padded batches (``vocoder.padded_batch``) of at most ``max_frames``
    padded frames (rows x the chunk's longest row up to a multiple of ``bucket``: MIOpen meets few
    widths; a longer row runs alone); ``max_frames <= 0``: one call. On CPU with several torch
    threads the chunks run side by side, one thread each (:func:`row_pool`). Call it under
    ``torch.inference_mode`` (each worker thread enters its own).
    """
    cpu = mel.device.type == "cpu"
    bsz, _, frames = mel.shape
    if max_frames <= 0 or bsz <= 1:
        return vocoder.padded_batch(mel, mel_len)
    lens = mel_len.to(torch.long).cpu().clamp(min=0, max=frames)
    chunks = chunks_by_length(lens.tolist(), max_frames)  # from the rows alone: bytes do not
    # depend on the thread count (a row's chunk decides its padded GEMM shapes)
    if len(chunks) == 1:
        return vocoder.padded_batch(mel, mel_len)
    up = vocoder.upsample_scale
    threads = min(torch.get_num_threads(), len(chunks)) if cpu else 1
    wav = torch.zeros(bsz, frames * up, device=mel.device, dtype=torch.float32)

    def run(rows: list[int]) -> tuple[Tensor, Tensor]:
        index = torch.tensor(rows, dtype=torch.long, device=mel.device)
        width = min(frames, -(-int(lens[rows].max()) // max(1, bucket)) * max(1, bucket))  # the chunk's own
        with torch.inference_mode():  # per thread
            wav_rows, _ = vocoder.padded_batch(
                mel[:, :, :width].index_select(0, index), lens[rows].to(mel.device)
            )
            return index, wav_rows

    if threads > 1:
        vocoder.reserve_noise(int(lens.max()) * up)  # grown here, not raced by the workers
        with row_pool(threads) as pool:
            parts = pool.map(run, chunks)
            for index, part in parts:
                wav[index, : part.shape[1]] = part
    else:
        for index, part in map(run, chunks):
            wav[index, : part.shape[1]] = part
    return wav, lens.to(mel.device) * up


def row_pool(threads: int) -> ThreadPoolExecutor:
    """Worker threads that run HiFT chunks side by side on CPU, one intra-op thread each (a pool
    per call, so no thread outlives it: a live thread would stop the text pool from forking).

    Why: two chunks on one thread each beat one chunk after the other on two threads (AMD EPYC
    Zen 4, 2 cores, batch 4 and 8 of 4 s rows: 0-10% a row, median about 5%), because the convs' own
    threading leaves a share of each op serial. ``torch.set_num_threads`` is per thread here
    (OpenMP's and MKL's thread-local settings), so the caller keeps its threads.
    """
    return ThreadPoolExecutor(threads, thread_name_prefix="cosyclone-hift", initializer=torch.set_num_threads,
                              initargs=(1,))
