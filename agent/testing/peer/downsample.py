"""Integer-factor downsampling of a finished recording (48 kHz → the analysis rates: the echo
measurement's and the speech detector's 8 kHz): a windowed-sinc low-pass FIR evaluated only
at the kept samples, as two matrix products. `upsample` is the way back (8 kHz G.711 kept as
bytes during a load test → the peer's 48 kHz), the same kind of filter as three products.

Written here rather than taken from a library because of what the peer pays per call and per
process: `agent.testing.testsignal.decimate` is an FFT over the whole call, slow for the
lengths with a large prime factor that a call's pieces add up to, and scipy's
`resample_poly` (the same polyphase idea) costs ~0.6 s of CPU just to import
`scipy.signal`, in every peer process. The filter is zero-phase (centred), so output sample
k lies exactly at input sample k × factor: the VAD's edges and the echo's lag keep their
times.

How it is evaluated: the outputs are taken `per_block` at a time. A block of outputs needs
the input of its own block (`per_block × factor` samples) and of the next one, so with the
input cut into such blocks (a reshape, no copy) every output block is one row of
`blocks[:-1] @ first.T + blocks[1:] @ second.T`, where `first`/`second` hold the filter once
per output of a block. Two single-precision GEMMs do about twice the multiplications of the
filter itself, but at BLAS speed: 6-14x faster than one `np.correlate` per polyphase branch
(whose per-output call overhead dominated), with the same output to 1e-6. The products are
taken `SMALL_PRODUCT` multiply-adds at a time at most: OpenBLAS runs a product that small on
the calling thread, while a larger one wakes its other threads, whose spinning afterwards
cost the process more CPU than they saved (a load-testing caller counts its CPU).
"""

from __future__ import annotations

import functools

import numpy as np

TAPS_PER_FACTOR = 32  # filter length = this × factor + 1
PASSBAND = 0.9  # the cut-off as a share of the new Nyquist frequency
KAISER_BETA = 8.0  # ~80 dB stop-band
UP_PASSBAND = 0.97  # upsampling's cut-off, a share of the old Nyquist (libswresample's)
SMALL_PRODUCT = 1 << 18  # multiply-adds OpenBLAS does on the calling thread (65536 × 4)


@functools.lru_cache(maxsize=8)
def lowpass(factor: int, passband: float = PASSBAND) -> np.ndarray:
    """The FIR for `factor`: odd length, symmetric, unit gain at DC."""
    length = TAPS_PER_FACTOR * factor + 1
    n = np.arange(length) - length // 2
    cutoff = passband / factor / 2  # cycles per input sample
    taps = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(length, KAISER_BETA)
    taps /= taps.sum()
    taps.flags.writeable = False
    return taps


@functools.lru_cache(maxsize=8)
def _block_filters(factor: int) -> tuple[np.ndarray, np.ndarray]:
    """(first, second): (per_block, block) float32 matrices; output p of a block is
    first[p] · its own input block + second[p] · the next input block."""
    taps = lowpass(factor)
    per_block = -(-len(taps) // factor)
    block = per_block * factor
    both = np.zeros((per_block, 2 * block), dtype=np.float32)
    for p in range(per_block):
        both[p, p * factor : p * factor + len(taps)] = taps
    first = np.ascontiguousarray(both[:, :block].T)
    second = np.ascontiguousarray(both[:, block:].T)
    first.flags.writeable = second.flags.writeable = False
    return first, second


def downsample(samples: np.ndarray, factor: int) -> np.ndarray:
    """Float32 `samples` band-limited and kept every `factor`-th (ceil(len / factor) out)."""
    audio = np.asarray(samples, dtype=np.float32).reshape(-1)
    if factor <= 1 or len(audio) == 0:
        return audio.copy()
    first, second = _block_filters(factor)
    block, per_block = first.shape
    half = len(lowpass(factor)) // 2
    count = -(-len(audio) // factor)
    blocks = -(-count // per_block)
    # Output k is taps · padded[k*factor : k*factor + len(taps)] (the taps are symmetric).
    padded = np.zeros((blocks + 1) * block, dtype=np.float32)
    padded[half : half + len(audio)] = audio
    cut = padded.reshape(blocks + 1, block)
    out = np.empty((blocks, per_block), dtype=np.float32)
    step = max(1, SMALL_PRODUCT // (block * per_block))
    for row in range(0, blocks, step):
        end = min(blocks, row + step)
        np.matmul(cut[row:end], first, out=out[row:end])
        out[row:end] += cut[row + 1 : end + 1] @ second
    return out.reshape(-1)[:count]


@functools.lru_cache(maxsize=8)
def _spread_filters(factor: int) -> tuple[int, np.ndarray]:
    """(inputs per block, (3, inputs, inputs × factor) float32): what the previous, the own and
    the next block of inputs add to a block's outputs."""
    taps = lowpass(factor, UP_PASSBAND) * factor
    half = len(taps) // 2
    per_block = max(16, -(-half // factor))  # the filter reaches no further than one block
    outputs = np.arange(per_block * factor)
    filters = np.zeros((3, per_block, per_block * factor), dtype=np.float32)
    for which, block in enumerate((-1, 0, 1)):
        for j in range(per_block):
            distance = outputs - factor * (block * per_block + j)
            near = np.abs(distance) <= half
            filters[which, j, near] = taps[half + distance[near]]
    filters.flags.writeable = False
    return per_block, filters


def upsample(samples: np.ndarray, factor: int) -> np.ndarray:
    """Float32 `samples` at `factor` times their rate (len × factor out), interpolated by the
    same kind of zero-phase FIR: output sample k × factor lies at input sample k."""
    audio = np.asarray(samples, dtype=np.float32).reshape(-1)
    if factor <= 1 or len(audio) == 0:
        return audio.copy()
    per_block, filters = _spread_filters(factor)
    blocks = -(-len(audio) // per_block)
    padded = np.zeros((blocks + 2) * per_block, dtype=np.float32)
    padded[per_block : per_block + len(audio)] = audio
    cut = padded.reshape(blocks + 2, per_block)
    out = np.empty((blocks, per_block * factor), dtype=np.float32)
    step = max(1, SMALL_PRODUCT // (per_block * per_block * factor))
    for row in range(0, blocks, step):
        end = min(blocks, row + step)
        np.matmul(cut[row:end], filters[0], out=out[row:end])
        out[row:end] += cut[row + 1 : end + 1] @ filters[1]
        out[row:end] += cut[row + 2 : end + 2] @ filters[2]
    return out.reshape(-1)[: len(audio) * factor]
