/*
 * session.h — a session's allocation (session.c): how its K/V cache grows,
 * and what the entry points that feed a session call on it (making room,
 * sampling). The state itself is session_state.h's; the forward pass over
 * it is forward.h's. Not ABI.
 */
#ifndef LS_SESSION_H
#define LS_SESSION_H

#include <stdint.h>

#include "runtime.h"
#include "session_state.h"

/* A session's K/V cache starts with room for LS_KV_FIRST_ROWS positions
 * (or its cap) and, when a call needs more, at least doubles, in whole
 * blocks of LS_KV_BLOCK rows, up to cap: memory follows the positions
 * actually fed, and the copies of growing sum to less than the final size.
 * A growth is one allocation and copy of the whole cache, and first
 * touches of fresh pages are slow on some hosts
 * (docs/kernels.md#tuning-figures): the first allocation covers a common
 * request so that most never grow. */
#define LS_KV_BLOCK 64
#define LS_KV_FIRST_ROWS 512
/* Rows allocated past the last usable one: they keep the value rows of
 * consecutive heads off power-of-two strides, which would put one position
 * of every head in the same cache sets. */
#define LS_KV_ROW_PAD 8

/* Makes room for positions [0, end) (slots below min(end, cap)) before a
 * call writes them: LS_OK, or LS_ERR_NOMEM with the session unchanged.
 * Every entry point that stores K/V calls it before changing anything. */
int32_t ls_session_reserve(ls_session *s, int32_t end);

/* Makes room for the deferred-unit states (exact early exit) of positions
 * [0, end): LS_OK, or LS_ERR_NOMEM with the session unchanged. Every entry
 * point that may keep a state calls it before changing anything. */
int32_t ls_session_defer_reserve(ls_session *s, int32_t end);

/* Keeps position pos's hidden state h (dim), the input of its unit `units`,
 * whose units from there on are deferred; room reserved. */
void ls_session_defer(ls_session *s, int32_t pos, int32_t units, const float *h);

/* Draws the next token from logits, the last row the session was fed, as
 * ls_session_step does (history: the session's tokens; RNG counter: its
 * position). Shared by ls_session_step and ls_batch_step; reads only s, so
 * several sessions may draw at once on different threads. */
int32_t ls_step_sample(const ls_session *s, const float *logits, const ls_step_params *p);

#endif
