"""Blockwise online-softmax attention with a recomputing backward (never a [T, S] array).

The forward walks query blocks, and inside each the key blocks, keeping float32 running
max / sum / output per query (FlashAttention's online softmax); it saves only the output and
each query's log-sum-exp. The backward (FlashAttention-2) walks key blocks, and inside each
the query blocks, recomputing one [bq, bk] tile of probabilities at a time. Peak memory is
O(T + S) plus one tile; loops are `fori_loop`s, so compile time does not grow with length.

A (query block, key block) pair is skipped (`lax.cond`) when no query of the block can see
any key of it: every key slot past the block's largest query slot (causal), or all keys
empty. Axis letters: B batch, T query tokens, S key slots, K kv heads, G query heads per kv
head, H head dim (Hq for queries/keys, Hv for values).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax


class Masks:
    """Per-query and per-key mask inputs (all int32/bool, padded to whole blocks)."""

    def __init__(self, q_slots, kv_valid, q_seg, kv_seg):
        self.q_slots, self.kv_valid, self.q_seg, self.kv_seg = q_slots, kv_valid, q_seg, kv_seg

    def q_block(self, i, bq):
        return (
            lax.dynamic_slice_in_dim(self.q_slots, i * bq, bq, 1),
            lax.dynamic_slice_in_dim(self.q_seg, i * bq, bq, 1),
        )

    def k_block(self, j, bk):
        return (
            lax.dynamic_slice_in_dim(self.kv_valid, j * bk, bk, 1),
            lax.dynamic_slice_in_dim(self.kv_seg, j * bk, bk, 1),
        )


def _visible(j, bk, slots, segq, valid, segk):
    """[B, bq, bk] bool: key slot s (of block j) visible to a query (causal, valid, segment)."""
    s = j * bk + jnp.arange(bk, dtype=jnp.int32)
    vis = s[None, None, :] <= slots[:, :, None]
    vis &= valid[:, None, :]
    return vis & (segq[:, :, None] == segk[:, None, :])


def _active(j, bk, slots, valid):
    """Whether any query of a query block may see any key of key block j (cheap bound)."""
    return (j * bk <= jnp.max(slots)) & jnp.any(valid)


def _scores(qb, kb, scale):
    return jnp.einsum("BTKGH,BSKH->BKGTS", qb, kb, preferred_element_type=jnp.float32) * scale


def _forward(q, k, v, masks: Masks, scale, bq, bk):
    """(out [B, T, K, G, Hv] in q.dtype, lse [B, K, G, T] float32; -inf = nothing visible)."""
    b, t, nkv, g, _ = q.shape
    hv = v.shape[-1]
    nq, nk = t // bq, k.shape[1] // bk

    def q_step(i, carry):
        out_all, lse_all = carry
        qb = lax.dynamic_slice_in_dim(q, i * bq, bq, 1)
        slots, segq = masks.q_block(i, bq)

        def k_step(j, st):
            valid, segk = masks.k_block(j, bk)

            def tile(st):
                m, total, acc = st
                kb = lax.dynamic_slice_in_dim(k, j * bk, bk, 1)
                vb = lax.dynamic_slice_in_dim(v, j * bk, bk, 1)
                vis = _visible(j, bk, slots, segq, valid, segk)[:, None, None]
                s = jnp.where(vis, _scores(qb, kb, scale), -jnp.inf)
                m_new = jnp.maximum(m, s.max(-1))
                m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
                p = jnp.exp(s - m_safe[..., None])  # exp(-inf) = 0 on hidden keys
                corr = jnp.exp(m - m_safe)
                pv = jnp.einsum(
                    "BKGTS,BSKH->BKGTH", p.astype(v.dtype), vb, preferred_element_type=jnp.float32
                )
                return m_new, total * corr + p.sum(-1), acc * corr[..., None] + pv

            return lax.cond(_active(j, bk, slots, valid), tile, lambda st: st, st)

        init = (
            jnp.full((b, nkv, g, bq), -jnp.inf, jnp.float32),
            jnp.zeros((b, nkv, g, bq), jnp.float32),
            jnp.zeros((b, nkv, g, bq, hv), jnp.float32),
        )
        m, total, acc = lax.fori_loop(0, nk, k_step, init)
        seen = total > 0
        out = jnp.where(seen[..., None], acc / jnp.where(seen, total, 1.0)[..., None], 0.0)
        lse = jnp.where(seen, m + jnp.log(jnp.where(seen, total, 1.0)), -jnp.inf)
        out = out.transpose(0, 3, 1, 2, 4).astype(q.dtype)  # [B, bq, K, G, Hv]
        out_all = lax.dynamic_update_slice_in_dim(out_all, out, i * bq, 1)
        return out_all, lax.dynamic_update_slice_in_dim(lse_all, lse, i * bq, 3)

    init = (
        jnp.zeros((b, t, nkv, g, hv), q.dtype),
        jnp.full((b, nkv, g, t), -jnp.inf, jnp.float32),
    )
    return lax.fori_loop(0, nq, q_step, init)


def _backward(q, k, v, masks: Masks, out, lse, dout, scale, bq, bk):
    """(dq, dk, dv) by recomputing each [bq, bk] tile of probabilities from the saved lse."""
    nq, nk = q.shape[1] // bq, k.shape[1] // bk
    dout32 = dout.astype(jnp.float32)
    delta = jnp.sum(dout32 * out.astype(jnp.float32), -1).transpose(0, 2, 3, 1)  # [B,K,G,T]
    lse_safe = jnp.where(jnp.isfinite(lse), lse, 0.0)

    def k_step(j, carry):
        dq, dk_all, dv_all = carry
        kb = lax.dynamic_slice_in_dim(k, j * bk, bk, 1)
        vb = lax.dynamic_slice_in_dim(v, j * bk, bk, 1)
        valid, segk = masks.k_block(j, bk)

        def q_step(i, st):
            slots, segq = masks.q_block(i, bq)

            def tile(st):
                dq, dk, dv = st
                qb = lax.dynamic_slice_in_dim(q, i * bq, bq, 1)
                dob = lax.dynamic_slice_in_dim(dout32, i * bq, bq, 1)
                lse_b = lax.dynamic_slice_in_dim(lse_safe, i * bq, bq, 3)
                d_b = lax.dynamic_slice_in_dim(delta, i * bq, bq, 3)
                vis = _visible(j, bk, slots, segq, valid, segk)[:, None, None]
                p = jnp.where(vis, jnp.exp(_scores(qb, kb, scale) - lse_b[..., None]), 0.0)
                dv = dv + jnp.einsum("BKGTS,BTKGH->BSKH", p, dob)
                dp = jnp.einsum("BTKGH,BSKH->BKGTS", dob, vb.astype(jnp.float32))
                ds = p * (dp - d_b[..., None]) * scale
                dq_b = jnp.einsum("BKGTS,BSKH->BTKGH", ds, kb.astype(jnp.float32))
                dq_old = lax.dynamic_slice_in_dim(dq, i * bq, bq, 1)
                dq = lax.dynamic_update_slice_in_dim(dq, dq_old + dq_b, i * bq, 1)
                dk = dk + jnp.einsum("BKGTS,BTKGH->BSKH", ds, qb.astype(jnp.float32))
                return dq, dk, dv

            return lax.cond(_active(j, bk, slots, valid), tile, lambda st: st, st)

        zeros_k = jnp.zeros(kb.shape, jnp.float32)
        zeros_v = jnp.zeros(vb.shape, jnp.float32)
        dq, dk, dv = lax.fori_loop(0, nq, q_step, (dq, zeros_k, zeros_v))
        dk_all = lax.dynamic_update_slice_in_dim(dk_all, dk.astype(k.dtype), j * bk, 1)
        dv_all = lax.dynamic_update_slice_in_dim(dv_all, dv.astype(v.dtype), j * bk, 1)
        return dq, dk_all, dv_all

    init = (jnp.zeros(q.shape, jnp.float32), jnp.zeros_like(k), jnp.zeros_like(v))
    dq, dk, dv = lax.fori_loop(0, nk, k_step, init)
    return dq.astype(q.dtype), dk, dv


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def blockwise(q, k, v, q_slots, kv_valid, q_seg, kv_seg, scale, bq, bk):
    """Attention of q [B, T, K, G, Hq] over k [B, S, K, Hq], v [B, S, K, Hv].

    T and S must be multiples of bq and bk (the caller pads: padded queries get slot -1,
    padded keys kv_valid False). Returns [B, T, K, G, Hv] in q.dtype; zeros where a query
    sees no key.
    """
    return _forward(q, k, v, Masks(q_slots, kv_valid, q_seg, kv_seg), scale, bq, bk)[0]


def _blockwise_fwd(q, k, v, q_slots, kv_valid, q_seg, kv_seg, scale, bq, bk):
    masks = Masks(q_slots, kv_valid, q_seg, kv_seg)
    out, lse = _forward(q, k, v, masks, scale, bq, bk)
    return out, (q, k, v, q_slots, kv_valid, q_seg, kv_seg, out, lse)


def _blockwise_bwd(scale, bq, bk, res, dout):
    q, k, v, q_slots, kv_valid, q_seg, kv_seg, out, lse = res
    masks = Masks(q_slots, kv_valid, q_seg, kv_seg)
    dq, dk, dv = _backward(q, k, v, masks, out, lse, dout, scale, bq, bk)
    return dq, dk, dv, None, None, None, None


blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)
