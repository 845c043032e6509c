"""The constrained-sampling kernel in Triton: one program per row, no sort, few passes.

Contract: ``radixlm.kernels.sampling`` (the plain-torch reference of the same
distribution). The draw is an exponential race, the same one the staged sampler
uses for seeded rows: token t gets E_t = -log(u_t), u_t from Philox4x32-10 keyed by
the row's seed at counter (t, offset low word, offset high word, 0), and it returns

    argmax over the kept set K of  z_t - log(E_t)     (= argmax e_t / E_t)

which is token t with probability e_t / sum(e over K), exactly. The race needs no
normalising mass and no running sum, and noise in the logits changes the token only
where the two best scores lie within it (a seeded row stays batch-invariant).

K (top-k, then top-p over the top-k mass, then min-p: each "every token whose z
reaches a threshold", ties included) is found without sorting. Passes over the row:

    pass 1   logits, bitmask -> z = l / T to a (B, V) float32 workspace, and max l (the
             bitmask is read here, once). Rows without top-k also run the race over
             every allowed token here: the first candidate j.
    top-k    1 < top_k < V: radix select on z's order key, 8 bits a digit with a
             256-bin histogram: the top two bytes of the k-th largest key in two
             passes, then one pass gathers the ids of every token whose key's top 16
             bits reach them (the top-k set and a few boundary neighbours) into a
             (B, CAPACITY) buffer. With at most CAPACITY of them, everything else runs
             in registers over the candidates alone: the last two digits, their race
             scores, and rounds (below) that cost no pass. More (ties, flat rows):
             two more radix passes, then rounds over the row.
    rounds   top_p < 1: a round checks candidate j (the top-k mass, the mass strictly
             more likely than j) and finds the race winner among the tokens strictly
             above j. j is kept iff that mass is < top_p * (top-k mass), or nothing is
             more likely. Kept: done (the winner over a superset of K that lies in K
             is the winner over K). Rejected: nothing at or below j can be kept, so
             the winner above j is the next candidate. Without top_p, K is known: the
             winner over it directly. Over the row (no top-k, or more than CAPACITY
             top-k tokens), a round is one pass.
    fallback after MAX_ROUNDS rejections over the row: top-p's threshold by bisection on
             e's bits (<= 32 passes), then one pass for the winner over K. The race's
             noise is a function of (seed, offset, t) alone, so the fallback (and the
             register path) return the very token the rounds over the row would.

Passes per row: greedy 1 (a read of logits and bitmask; nothing written); top-k with
or without top-p / min-p 1 + 2 + 1 (z, radix, gather), none with Philox; no top-k 1 +
R, each with Philox for every token: R = 0 for plain rows, else the rounds, 1.0-1.13 on
average and at most 2 over 200 simulated rows of 128,256 tokens at T 0.7, top-p 0.9
(random half-masked, peaked and Zipf logits). Philox costs ~100 integer operations a
token, so rows with top-p but no top-k, or plain rows, are the slow ones on a GPU.

One program per row: 128 rows nearly fill an H200's 132 SMs, and a row that stays on
one SM needs no cross-program reduction between the passes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixlm.kernels.sampling import GREEDY_TEMPERATURE, check_sample_args, per_row

__all__ = ["masked_sample_triton"]

# Largest vocab block one program holds at a time.
_MAX_BLOCK = 4096
# Rejection rounds over the row before the exact fallback.
MAX_ROUNDS = 8
# How many top-k tokens (ties included) a row gathers for its rounds in registers.
CAPACITY = 1024
# Constants the kernels read (Triton only lets a kernel read constexpr globals).
_GREEDY_TEMPERATURE = tl.constexpr(GREEDY_TEMPERATURE)
_INT32_MAX = tl.constexpr(2147483647)
# Bit pattern of 1.0f, the largest e (e = exp(0) at the max).
_ONE_BITS = tl.constexpr(0x3F800000)
# Philox's 32 bits -> u in [0, 1), as tl.rand: (x < 0 ? ~x : x) * _U_SCALE for int32 x.
_U_SCALE = tl.constexpr(4.6566127342e-10)
# Smallest u the race uses: u = 0 (one draw in 2^31) would make E infinite.
_U_MIN = tl.constexpr(1e-10)


# ---- Triton -----------------------------------------------------------------------------
#
# Each helper is one pass (or one search) over the row, in BLOCK-sized chunks. The
# workspace row holds z = masked logits / temperature; e = float32(exp(float64(z - z_max)))
# is recomputed from it where needed (0 outside the top-k set).


@triton.jit
def _argmax_pass(
    logits_ptr, bitmask_ptr, row, vocab_size, stride_l, stride_b,
    HAS_BITMASK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """(max masked logit, its lowest index as int64; -1 when all are -inf)."""
    best = tl.full((), float("-inf"), tl.float32)
    best_id = tl.full((), -1, tl.int64)
    for start in range(0, vocab_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        in_vocab = offs < vocab_size
        logit = tl.load(logits_ptr + row * stride_l + offs, mask=in_vocab, other=float("-inf"))
        logit = logit.to(tl.float32)
        if HAS_BITMASK:
            words = tl.load(bitmask_ptr + row * stride_b + offs // 32, mask=in_vocab, other=0)
            logit = tl.where(((words >> (offs % 32)) & 1) != 0, logit, float("-inf"))
        block_max = tl.max(logit, axis=0)
        block_id = tl.min(tl.where(logit == block_max, offs, _INT32_MAX), axis=0)
        better = (block_max > best) & (block_max > float("-inf"))  # an earlier block wins ties
        best_id = tl.where(better, block_id.to(tl.int64), best_id)
        best = tl.where(better, block_max, best)
    return best, best_id


@triton.jit
def _z_pass(
    logits_ptr, bitmask_ptr, ws_ptr, row, vocab_size, stride_l, stride_b, temperature,
    race, seed, offset_lo, offset_hi, HAS_BITMASK: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Writes z = masked logits / temperature to the workspace row.

    Returns (max masked logit, the race winner over the allowed tokens if ``race``;
    else, or if none is allowed, -1).
    """
    l_max = tl.full((), float("-inf"), tl.float32)
    best = tl.full((), float("-inf"), tl.float32)
    best_id = tl.full((), -1, tl.int64)
    for start in range(0, vocab_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        in_vocab = offs < vocab_size
        logit = tl.load(logits_ptr + row * stride_l + offs, mask=in_vocab, other=float("-inf"))
        logit = logit.to(tl.float32)
        if HAS_BITMASK:
            words = tl.load(bitmask_ptr + row * stride_b + offs // 32, mask=in_vocab, other=0)
            logit = tl.where(((words >> (offs % 32)) & 1) != 0, logit, float("-inf"))
        z = tl.math.div_rn(logit, temperature)
        tl.store(ws_ptr + row * vocab_size + offs, z, mask=in_vocab)
        l_max = tl.maximum(l_max, tl.max(logit, axis=0))
        if race:
            # the race score z - log(E), E = -log(u) ~ Exp(1), u from Philox at counter
            # (t, offset low, offset high, 0): what tl.rand(seed, offset << 32 | t) draws
            # for offsets < 2^32; tl.philox is called directly (fewer nested calls: they
            # cost under TRITON_INTERPRET)
            t = offs.to(tl.uint32)
            bits, _, _, _ = tl.philox(seed, t, t * 0 + offset_lo, t * 0 + offset_hi, t * 0)
            bits = bits.to(tl.int32, bitcast=True)
            u = tl.maximum(tl.where(bits < 0, ~bits, bits) * _U_SCALE, _U_MIN)
            score = tl.where(z > float("-inf"), z - tl.log(-tl.log(u)), float("-inf"))
            block_best = tl.max(score, axis=0)
            block_id = tl.min(tl.where(score == block_best, offs, _INT32_MAX), axis=0)
            better = (block_best > best) & (block_best > float("-inf"))
            best_id = tl.where(better, block_id.to(tl.int64), best_id)
            best = tl.where(better, block_best, best)
    return l_max, best_id


# Top-k by radix select on z's order key: an unsigned 32-bit integer (held in int64)
# that orders like z: the sign-folded bit pattern (negative floats order backwards as
# signed ints, so their 31 low bits are flipped; -0.0 maps to 0.0's key) plus 2^31.
# Digit d (0-3) is the key's d-th byte from the top; each fixes one byte of the k-th
# largest key: the largest byte whose bin, among the keys that share the bytes fixed
# so far, holds at least ``remaining`` keys at or above it.


@triton.jit
def _radix_step(hist, prefix, remaining):
    """(prefix, remaining) after the digit whose 256-bin histogram is ``hist``."""
    bins = tl.arange(0, 256)
    at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
    chosen = tl.max(tl.where(at_or_above >= remaining, bins, 0), axis=0)
    remaining -= tl.sum(tl.where(bins > chosen, hist, 0), axis=0)
    return prefix * 256 + chosen, remaining


@triton.jit
def _radix_row(
    ws_ptr, row, vocab_size, prefix, remaining, FIRST: tl.constexpr, LAST: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Digits FIRST..LAST-1 of the k-th largest key, a pass over the row each."""
    for digit in tl.static_range(FIRST, LAST):
        shift = 24 - 8 * digit
        hist = tl.zeros((256,), dtype=tl.int32)
        for start in range(0, vocab_size, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            in_vocab = offs < vocab_size
            z = tl.load(ws_ptr + row * vocab_size + offs, mask=in_vocab, other=0.0)
            bits = z.to(tl.int32, bitcast=True)
            key = tl.where(z == 0.0, 0, tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits))
            ukey = key.to(tl.int64) + 2147483648
            same = (ukey >> (shift + 8)) == prefix
            byte = ((ukey >> shift) & 255).to(tl.int32)
            hist += tl.histogram(byte, 256, mask=in_vocab & same)
        prefix, remaining = _radix_step(hist, prefix, remaining)
    return prefix, remaining


@triton.jit
def _radix_lanes(z, valid, prefix, remaining):
    """The k-th largest z from digits 2 and 3 over a register vector that holds every
    token whose key's top 16 bits reach ``prefix``."""
    bits = z.to(tl.int32, bitcast=True)
    key = tl.where(z == 0.0, 0, tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits))
    ukey = key.to(tl.int64) + 2147483648
    for digit in tl.static_range(2, 4):
        shift = 24 - 8 * digit
        same = (ukey >> (shift + 8)) == prefix
        byte = ((ukey >> shift) & 255).to(tl.int32)
        hist = tl.histogram(byte, 256, mask=valid & same)
        prefix, remaining = _radix_step(hist, prefix, remaining)
    return _key_to_z(prefix)


@triton.jit
def _key_to_z(ukey):
    key = (ukey - 2147483648).to(tl.int32)
    return tl.where(key < 0, key ^ 0x7FFFFFFF, key).to(tl.float32, bitcast=True)


@triton.jit
def _round_pass(
    ws_ptr, row, vocab_size, z_max, kth_z, e_floor, pivot_z, pivot_e, seed, offset_lo,
    offset_hi, BLOCK: tl.constexpr,
):  # fmt: skip
    """One pass: (top-k mass, mass of e > pivot_e, race winner among the tokens with
    z > pivot_z, e > 0 and e >= e_floor; -1 if none)."""
    mass = tl.full((), 0.0, tl.float64)
    above = tl.full((), 0.0, tl.float64)
    best = tl.full((), float("-inf"), tl.float32)
    best_id = tl.full((), -1, tl.int64)
    for start in range(0, vocab_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        in_vocab = offs < vocab_size
        z = tl.load(ws_ptr + row * vocab_size + offs, mask=in_vocab, other=float("-inf"))
        e = tl.exp((z - z_max).to(tl.float64)).to(tl.float32)
        e = tl.where(z >= kth_z, e, 0.0)
        mass += tl.sum(e.to(tl.float64), axis=0)
        above += tl.sum(tl.where(e > pivot_e, e, 0.0).to(tl.float64), axis=0)
        eligible = (z > pivot_z) & (e > 0.0) & (e >= e_floor)
        t = offs.to(tl.uint32)  # the score as in _z_pass
        bits, _, _, _ = tl.philox(seed, t, t * 0 + offset_lo, t * 0 + offset_hi, t * 0)
        bits = bits.to(tl.int32, bitcast=True)
        u = tl.maximum(tl.where(bits < 0, ~bits, bits) * _U_SCALE, _U_MIN)
        score = tl.where(eligible, z - tl.log(-tl.log(u)), float("-inf"))
        block_best = tl.max(score, axis=0)
        block_id = tl.min(tl.where(score == block_best, offs, _INT32_MAX), axis=0)
        better = (block_best > best) & (block_best > float("-inf"))
        best_id = tl.where(better, block_id.to(tl.int64), best_id)
        best = tl.where(better, block_best, best)
    return mass, above, best_id


@triton.jit
def _top_p_tau(ws_ptr, row, vocab_size, z_max, kth_z, top_p, mass, BLOCK: tl.constexpr):
    """tau, the largest e with mass {e >= tau} >= top_p * mass, by bisection on e's bits.

    e >= 0, so its int32 bit pattern orders like its value. Invariant: the mass at lo
    reaches the target (lo = 0 keeps everything), and the max e is exactly exp(0) =
    1.0 < hi. lo and hi snap to keys present, so the loop often ends early.
    """
    target = top_p.to(tl.float64) * mass
    lo = tl.full((), 0, tl.int64)
    hi = tl.full((), _ONE_BITS + 1, tl.int64)
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        mid_mass = tl.full((), 0.0, tl.float64)
        above = tl.full((), _INT32_MAX, tl.int64)  # smallest key >= mid
        below = lo  # largest key < mid
        for start in range(0, vocab_size, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = tl.load(
                ws_ptr + row * vocab_size + offs, mask=offs < vocab_size, other=float("-inf")
            )
            e = tl.exp((z - z_max).to(tl.float64)).to(tl.float32)
            e = tl.where(z >= kth_z, e, 0.0)
            bits = e.to(tl.int32, bitcast=True)
            ge = bits >= mid
            mid_mass += tl.sum(tl.where(ge, e, 0.0).to(tl.float64), axis=0)
            above = tl.minimum(above, tl.min(tl.where(ge, bits, _INT32_MAX), axis=0).to(tl.int64))
            below = tl.maximum(below, tl.max(tl.where(ge, 0, bits), axis=0).to(tl.int64))
        fits = mid_mass >= target
        lo = tl.where(fits, tl.minimum(above, hi - 1), lo)
        hi = tl.where(fits, hi, below + 1)
    return lo.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _gather_candidates(ws_ptr, cand_ptr, row, vocab_size, prefix, CAP: tl.constexpr,
                       BLOCK: tl.constexpr):  # fmt: skip
    """Writes the ids of the tokens whose key's top 16 bits reach ``prefix`` (a superset
    of the top-k set), in id order, to the row's candidate buffer (the first CAP of
    them); returns how many there are."""
    count = tl.full((), 0, tl.int32)
    for start in range(0, vocab_size, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        in_vocab = offs < vocab_size
        z = tl.load(ws_ptr + row * vocab_size + offs, mask=in_vocab, other=0.0)
        bits = z.to(tl.int32, bitcast=True)
        key = tl.where(z == 0.0, 0, tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits))
        hit = in_vocab & (((key.to(tl.int64) + 2147483648) >> 16) >= prefix)
        at = count + tl.cumsum(hit.to(tl.int32), axis=0) - 1
        tl.store(cand_ptr + row * CAP + at, offs, mask=hit & (at < CAP))
        count += tl.sum(hit.to(tl.int32), axis=0)
    return count


@triton.jit
def _race_candidates(
    ws_ptr, cand_ptr, row, vocab_size, count, prefix, remaining, z_max, top_p, min_p, seed,
    offset_lo, offset_hi, CAP: tl.constexpr,
):  # fmt: skip
    """The race winner over K when the buffer holds a superset of the top-k set (count
    <= CAP): the last two radix digits, then rounds in registers, each over the
    candidates alone, until one is kept (the most likely always is, so at most
    ``count`` rounds; ~1 on LM rows)."""
    lane = tl.arange(0, CAP)
    valid = lane < count
    ids = tl.load(cand_ptr + row * CAP + lane, mask=valid, other=0)
    z = tl.load(ws_ptr + row * vocab_size + ids, mask=valid, other=float("-inf"))
    valid &= z >= _radix_lanes(z, valid, prefix, remaining)  # the top-k set
    e = tl.where(valid, tl.exp((z - z_max).to(tl.float64)).to(tl.float32), 0.0)
    t = ids.to(tl.uint32)  # the score as in _z_pass
    bits, _, _, _ = tl.philox(seed, t, t * 0 + offset_lo, t * 0 + offset_hi, t * 0)
    bits = bits.to(tl.int32, bitcast=True)
    u = tl.maximum(tl.where(bits < 0, ~bits, bits) * _U_SCALE, _U_MIN)
    score = tl.where(valid & (e > 0.0) & (e >= min_p), z - tl.log(-tl.log(u)), float("-inf"))
    target = top_p.to(tl.float64) * tl.sum(e.to(tl.float64), axis=0)
    pivot = tl.full((), float("-inf"), tl.float32)
    token = tl.full((), -1, tl.int32)
    done = tl.full((), 0, tl.int1)
    while ~done:
        above_pivot = tl.where(z > pivot, score, float("-inf"))
        best = tl.max(above_pivot, axis=0)
        pick = tl.min(tl.where(above_pivot == best, lane, CAP), axis=0)  # the lowest id
        pivot = tl.max(tl.where(lane == pick, z, float("-inf")), axis=0)
        pick_e = tl.max(tl.where(lane == pick, e, 0.0), axis=0)
        above = tl.sum(tl.where(e > pick_e, e, 0.0).to(tl.float64), axis=0)
        token = tl.max(tl.where(lane == pick, ids, -1), axis=0)
        done = (top_p >= 1.0) | (above < target) | (above == 0.0) | (best == float("-inf"))
    return token.to(tl.int64)


@triton.jit
def _sample_top_k(
    ws_ptr, cand_ptr, row, vocab_size, z_max, top_k, top_p, min_p, seed, offset_lo,
    offset_hi, MAX_ROUNDS: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The race winner over K of a top-k row: in registers over the gathered top-k set,
    or (more than CAP tokens, ties) by passes over the row."""
    prefix = tl.full((), 0, tl.int64)
    prefix, remaining = _radix_row(ws_ptr, row, vocab_size, prefix, top_k, 0, 2, BLOCK)
    count = _gather_candidates(ws_ptr, cand_ptr, row, vocab_size, prefix, CAP, BLOCK)
    if count <= CAP:
        token = _race_candidates(
            ws_ptr, cand_ptr, row, vocab_size, count, prefix, remaining, z_max, top_p, min_p,
            seed, offset_lo, offset_hi, CAP,
        )  # fmt: skip
    else:
        prefix, remaining = _radix_row(ws_ptr, row, vocab_size, prefix, remaining, 2, 4, BLOCK)
        kth_z = _key_to_z(prefix)
        _, _, token = _round_pass(
            ws_ptr, row, vocab_size, z_max, kth_z, min_p, float("-inf"), 2.0, seed, offset_lo,
            offset_hi, BLOCK,
        )  # fmt: skip
        token = _sample_row(
            ws_ptr, row, vocab_size, z_max, kth_z, top_p, min_p, seed, offset_lo, offset_hi,
            token, MAX_ROUNDS, BLOCK,
        )  # fmt: skip
    return token


@triton.jit
def _sample_row(
    ws_ptr, row, vocab_size, z_max, kth_z, top_p, min_p, seed, offset_lo, offset_hi, token,
    MAX_ROUNDS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The race winner over K by passes over the row, given the winner ``token`` over a
    superset of K that is every allowed token with z >= kth_z at or above some z."""
    z = tl.load(ws_ptr + row * vocab_size + token)
    e = tl.where(z >= kth_z, tl.exp((z - z_max).to(tl.float64)).to(tl.float32), 0.0)
    fits = (e > 0.0) & (e >= min_p)  # K without top-p (e > 0 implies z >= kth_z)
    if top_p < 1.0:
        # Invariant: K holds no token with z <= the candidate's z unless the candidate
        # fits and is kept, so the winner above it is the next candidate.
        rounds = tl.full((), 0, tl.int32)
        done = tl.full((), 0, tl.int1)
        while (rounds < MAX_ROUNDS) & ~done:
            mass, above, winner = _round_pass(
                ws_ptr, row, vocab_size, z_max, kth_z, min_p, z, e, seed, offset_lo, offset_hi,
                BLOCK,
            )  # fmt: skip
            kept = fits & ((above < top_p.to(tl.float64) * mass) | (above == 0.0))
            done = kept | (winner < 0)
            if ~done:
                token = winner
                z = tl.load(ws_ptr + row * vocab_size + token)
                e = tl.where(z >= kth_z, tl.exp((z - z_max).to(tl.float64)).to(tl.float32), 0.0)
                fits = winner >= 0  # the winner passed the static filters
            rounds += 1
        if ~done:
            mass, _, _ = _round_pass(
                ws_ptr, row, vocab_size, z_max, kth_z, min_p, z, e, seed, offset_lo, offset_hi,
                BLOCK,
            )  # fmt: skip
            tau = _top_p_tau(ws_ptr, row, vocab_size, z_max, kth_z, top_p, mass, BLOCK)
            _, _, token = _round_pass(
                ws_ptr, row, vocab_size, z_max, kth_z, tl.maximum(tau, min_p),
                float("-inf"), 2.0, seed, offset_lo, offset_hi, BLOCK,
            )  # fmt: skip
    elif ~fits:
        _, _, token = _round_pass(
            ws_ptr, row, vocab_size, z_max, kth_z, min_p, float("-inf"), 2.0, seed, offset_lo,
            offset_hi, BLOCK,
        )  # fmt: skip
    return token


@triton.jit
def _masked_sample_kernel(
    logits_ptr, bitmask_ptr, temperatures_ptr, top_ks_ptr, top_ps_ptr, min_ps_ptr,
    seeds_ptr, offsets_ptr, ws_ptr, cand_ptr, out_ptr, vocab_size, stride_l, stride_b,
    HAS_BITMASK: tl.constexpr, MAX_ROUNDS: tl.constexpr, CAP: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """One program per row; see the module docstring for what it computes."""
    row = tl.program_id(0).to(tl.int64)
    temperature = tl.load(temperatures_ptr + row)
    top_k = tl.load(top_ks_ptr + row)
    greedy = (temperature < _GREEDY_TEMPERATURE) | (top_k == 1)
    if greedy:
        _, token = _argmax_pass(
            logits_ptr, bitmask_ptr, row, vocab_size, stride_l, stride_b, HAS_BITMASK, BLOCK
        )
    else:
        seed = tl.load(seeds_ptr + row)
        offset = tl.load(offsets_ptr + row)
        offset_lo = (offset & 0xFFFFFFFF).to(tl.uint32)
        offset_hi = (offset >> 32).to(tl.uint32)
        top_k_on = (top_k > 1) & (top_k < vocab_size)
        l_max, token = _z_pass(
            logits_ptr, bitmask_ptr, ws_ptr, row, vocab_size, stride_l, stride_b,
            temperature, ~top_k_on, seed, offset_lo, offset_hi, HAS_BITMASK, BLOCK,
        )  # fmt: skip
        z_max = tl.math.div_rn(l_max, temperature)
        top_p = tl.load(top_ps_ptr + row)
        min_p = tl.load(min_ps_ptr + row)
        if l_max == float("-inf"):
            token = tl.full((), -1, tl.int64)
        elif top_k_on:
            token = _sample_top_k(
                ws_ptr, cand_ptr, row, vocab_size, z_max, top_k, top_p, min_p, seed,
                offset_lo, offset_hi, MAX_ROUNDS, CAP, BLOCK,
            )  # fmt: skip
        else:
            token = _sample_row(
                ws_ptr, row, vocab_size, z_max, float("-inf"), top_p, min_p, seed, offset_lo,
                offset_hi, token, MAX_ROUNDS, BLOCK,
            )  # fmt: skip
    tl.store(out_ptr + row, token)


def masked_sample_triton(
    logits: torch.Tensor,
    bitmask: torch.Tensor | None,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    seeds: torch.Tensor,
    offsets: torch.Tensor | None = None,
    min_ps: torch.Tensor | None = None,
    max_rounds: int = MAX_ROUNDS,
    capacity: int = CAPACITY,
) -> torch.Tensor:
    """Same distribution as :func:`masked_sample_reference`, as one Triton launch (a
    program per row), drawn by an exponential race over Philox noise (module docstring).
    The tensors must live where Triton runs (a GPU, or CPU under TRITON_INTERPRET=1).

    Args:
        logits, bitmask, temperatures, top_ks, top_ps, min_ps: as the reference's.
        seeds: (B,) int; the row's Philox key (its low 64 bits).
        offsets: (B,) int >= 0, the row's step, or None (all 0): token t of row i
            draws its noise from Philox counter (t, offset low, offset high, 0), so
            (seed, offset) alone fixes the row's draw, whatever else is in the batch.
        max_rounds: rejection rounds over the row before the exact fallback.
        capacity: a power of 2, the most top-k tokens (ties included) gathered for
            rounds in registers; beyond it, rounds over the row. The token is the same
            whatever these two are (tests lower them to reach the slower paths).

    Returns:
        (B,) int64 token ids; -1 for a row with no allowed token.

    Raises:
        ValueError: shapes or dtypes do not fit together.
    """
    check_sample_args(
        logits, bitmask, temperatures=temperatures, top_ks=top_ks, top_ps=top_ps,
        seeds=seeds, offsets=offsets, min_ps=min_ps,
    )  # fmt: skip
    for name, values in {"seeds": seeds, "offsets": offsets}.items():
        if values is not None and values.is_floating_point():
            raise ValueError(f"expected integer {name}, got {values.dtype}")
    if capacity < 1 or capacity & (capacity - 1):
        raise ValueError(f"expected a power of 2 for capacity, got {capacity}")
    num_rows, vocab_size = logits.shape
    offsets = torch.zeros_like(seeds) if offsets is None else offsets
    min_ps = torch.zeros_like(top_ps) if min_ps is None else min_ps
    out = torch.full((num_rows,), -1, dtype=torch.int64, device=logits.device)
    if num_rows == 0 or vocab_size == 0:
        return out
    logits = logits.contiguous()
    if bitmask is not None:
        bitmask = bitmask.to(logits.device).contiguous()
    block = min(_MAX_BLOCK, max(32, triton.next_power_of_2(vocab_size)))
    _masked_sample_kernel[(num_rows,)](
        logits,
        bitmask if bitmask is not None else logits,  # unread without a bitmask
        per_row(temperatures, torch.float32, logits.device),
        per_row(top_ks, torch.int32, logits.device),
        per_row(top_ps, torch.float32, logits.device),
        per_row(min_ps, torch.float32, logits.device),
        per_row(seeds, torch.int64, logits.device),
        per_row(offsets, torch.int64, logits.device),
        torch.empty_like(logits, dtype=torch.float32),  # the workspace: z
        torch.empty((num_rows, capacity), dtype=torch.int32, device=logits.device),
        out,
        vocab_size,
        logits.stride(0),
        bitmask.stride(0) if bitmask is not None else 0,
        HAS_BITMASK=bitmask is not None,
        MAX_ROUNDS=max_rounds,
        CAP=capacity,
        BLOCK=block,
        num_warps=8 if block >= 2048 else 4,
        enable_fp_fusion=False,  # no contracted a * b + c: every step rounds as in torch
    )
    return out
