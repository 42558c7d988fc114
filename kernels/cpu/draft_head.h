/*
 * draft_head.h — the coarse output head speculative drafts score tokens
 * with (draft_head.c; spec.c uses it). Its state lives in the runtime's
 * LS_RUNTIME_EXT_DRAFT_HEAD slot. Not ABI.
 */
#ifndef LS_DRAFT_HEAD_H
#define LS_DRAFT_HEAD_H

#include <stdint.h>

#include "internal.h"

typedef struct ls_draft_head ls_draft_head;

/* Builds the 2-bit draft head from the model's output head on first use
 * (about 0.15 s for the GPT-2 vocabulary at dim 768, 2 threads); it is
 * freed with the runtime. LS_ERR_NOMEM on failure. */
int32_t ls_draft_head_build(ls_model *m);
/* logits (vocab) of rmsnorm(h): the 2-bit head's score of every token
 * (NaN read as -inf); best gets the n best-scored ids (n <= LS_DRAFT_BEST),
 * ranked. Returns how many (min(n, vocab)). */
#define LS_DRAFT_BEST 16
int32_t ls_draft_head_coarse(ls_model *m, const float *h, float *logits, int32_t *best, int32_t n);
/* logits[ids[i]] = the model's own head on the hidden state of the last
 * ls_draft_head_coarse call, for i in [0, n). */
void ls_draft_head_exact(ls_model *m, const int32_t *ids, int32_t n, float *logits);

#endif
