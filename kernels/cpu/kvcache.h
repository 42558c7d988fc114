/*
 * kvcache.h — the key/value cache modes (loopserve.h LS_KV_*): encoding one
 * row, the Walsh-Hadamard rotation, and storing / copying rows of a
 * session's cache (attention.c, session.c). Reading is the ops kernels'
 * (ops.h attn_*). Not ABI.
 *
 * Every function here encodes one row (one unit, position and kv head) at
 * a time (ls_kv_store takes a run of rows, each on its own), in plain C
 * with a fixed operation order (no SIMD dispatch but the exact fp16
 * conversion; ISO C
 * mode keeps a*b+c unfused), so a row's bytes depend on its own values only:
 * never on the batch, the thread count or the SIMD path. The TypeScript
 * reference (test/reference/kvcache.ts) repeats the arithmetic bit for bit.
 *
 * Layouts of a quantized session (fp16 modes keep session_state.h's kc / vc):
 *   kq (slots, n_kv_heads, nb, ldq)  key codes, transposed: byte b of the
 *                                    row of position p at [b][p % cap]
 *   kp (slots, n_kv_heads, np, rows) key parameters, transposed likewise
 *   vq (slots, n_kv_heads, rows, nb) value codes, one row per slot
 *   vp (slots, n_kv_heads, rows, np) value parameters
 * (slots: the units' caches, session_state.h ls_unit_slot)
 * (rows: the session's allocated rows, at most cap; session_state.h)
 * nb = code bytes per row (int8: head_dim, int4: head_dim / 2), np = fp16
 * parameters per row (int8: the scale; int4: scale, offset per group).
 * Keys are transposed for the same reason as the fp16 cache: the score
 * kernels (ops.h attn_scores_i8 / _i4) put consecutive positions in the
 * lanes of a vector, so a score needs no horizontal sum.
 *
 * int4 code bytes: group g covers dims [g0, g0 + L) (g0 = 32 g, L = 32 but
 * shorter for the last group when head_dim is not a multiple of 32; L is
 * even); its L / 2 bytes start at byte g0 / 2, and byte g0 / 2 + i holds dim
 * g0 + i in the low nibble and dim g0 + L / 2 + i in the high nibble (the
 * two halves of a group unpack into contiguous lanes, as ggml's Q4_0).
 */
#ifndef LS_KVCACHE_H
#define LS_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "loopserve.h"

#define LS_KV_GROUP LS_KV_INT4_GROUP /* int4: values per scale/offset pair along head_dim */

// ---- rows ----

/* Code bytes and fp16 parameters of one row of hd values in format fmt
 * (LS_KV_INT8 / LS_KV_INT4; 0 for LS_KV_FP16). */
int32_t ls_kv_code_bytes(int32_t fmt, int32_t hd);
int32_t ls_kv_param_count(int32_t fmt, int32_t hd);

/* Encodes x (hd fp32 values) into codes / params; format as in loopserve.h.
 * Non-finite values give defined codes (NaN a fixed one, infinities
 * saturate) and finite parameters. */
void ls_kv_encode_row(int32_t fmt, const float *x, int32_t hd, uint8_t *codes, uint16_t *params);

/* The fp32 values a row decodes to: c * s (int8), c * s + z (int4). */
void ls_kv_decode_row(int32_t fmt, const uint8_t *codes, const uint16_t *params, int32_t hd, float *out);

/* In place: x = H x / sqrt(n), H the n x n Walsh-Hadamard matrix (n a power
 * of two). Orthonormal and symmetric, so it is its own inverse. */
void ls_kv_wht(float *x, int32_t n);

// ---- session ----

/* Validates kv_mode for a model of head_dim hd; writes why into err. */
int32_t ls_kv_check_mode(int32_t kv_mode, int32_t hd, char *err, int32_t err_len);

/* Most rows one ls_kv_store call takes (the size of a thread's key staging
 * tile, session_state.h k16). */
#define LS_KV_STORE_ROWS 32

/* Stores rows slot..slot+n-1 (1 <= n <= LS_KV_STORE_ROWS, consecutive ring
 * slots) of cache unit `unit` (a core unit or a fixed one, kept where
 * ls_unit_slot says), kv head kvh: row t's k and v (hd fp32 each, RoPE
 * applied) start at k + t * ld and v + t * ld, and are rotated and encoded
 * as the session's mode says. Each row's bytes depend on that row alone.
 * k and v are used as scratch (the rotation is in place); `thread` picks
 * the session's per-thread staging buffers, so pool tasks may store rows of
 * different slots at once. */
void ls_kv_store(ls_session *s, int32_t unit, int32_t kvh, int32_t slot, int32_t n, float *k, float *v, size_t ld,
                 int32_t thread);

/* Copies slot `from` of src's unit lf to slot `to` of dst's unit lt, every
 * kv head (dst may be src; both of the same mode and model). */
void ls_kv_copy_row(ls_session *dst, int32_t lt, int32_t to, const ls_session *src, int32_t lf, int32_t from);

#endif
