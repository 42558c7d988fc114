/*
 * spec.c — self-speculative decoding (docs/speculative.md): ls_spec_cycle.
 *
 * State between cycles: positions [0, p) committed in the caches of loops
 * [0, V) and in the history, plus a pending token x (sampled, not yet fed).
 * One cycle:
 *
 *   draft   x, d1, ..., dk go through units [0, D) one token at a time; the
 *           draft head on token i's loop-D state proposes d(i+1). Each
 *           token's loop-D hidden state is kept.
 *   verify  ONE batched pass resumes those k+1 states at loop D and runs
 *           loops [D, V) (loops 0..D-1 are never recomputed: their rows are
 *           exactly what a V-loop decode writes); then the
 *           fp16 head gives the verifier's token after each of them.
 *   accept  d1..dj, the longest prefix the verifier agrees with, plus the
 *           verifier's own token after dj: j + 1 new tokens. Every loop's
 *           cache is cut back to p + j + 1 positions; the last new token is
 *           the next pending token.
 *
 * A draft deeper than the verifier (D > V) is allowed: each drafted token
 * runs loops [0, V) once, which is already its verifier state (no verify
 * pass), and its draft state goes on through units [V, D). The caches of
 * loops [V, D) then follow the committed positions like the others; plain
 * decoding at V (the prompt's prefill) never wrote them, so the first such
 * cycle fills them in (ls_forward_deepen).
 *
 * Greedy output is bit-exact to plain decoding at V loops: every kernel is
 * batch-invariant (a row's values do not depend on the other rows of its
 * call), so each kept K/V row and each verifier logit is the one plain
 * decoding computes. With temperature > 0 the chain does standard
 * speculative sampling (accept d with probability min(1, p(d)/q(d)), else
 * draw from normalize(max(0, p - q)); all accepted: draw the bonus token
 * from p), so the output distribution is plain sampling's at V loops.
 *
 * Tree (K_branches = K > 1, greedy only): the greedy draft spine d1..dk plus,
 * at each depth i, the K-1 next-best draft tokens as leaves (children of
 * d(i-1)); up to 1 + K*k rows. Leaves get their loop-[0, D) rows in the
 * draft pass of their depth, batched with the spine token (tree-masked
 * attention), and every row runs loops [D, V) in one masked verify pass.
 * A leaf only pays off when it is accepted, and on a CPU verifying a row
 * costs almost a plain step, so leaves the draft gives less than
 * leaf_min_prob are left out (0: every top-K candidate). The walk follows
 * the spine while the verifier agrees; where it disagrees, a leaf holding
 * the verifier's token is accepted too (one more token), and its K/V rows
 * are moved into place. Leaves live in ring slots after the spine's, so the
 * cycle needs p + 1 + K*k <= max_seq. K = 1 is the chain code itself.
 *
 * Draft head: the output head (vocab x dim) costs several loops of the
 * block, and the draft runs it once per drafted token, unbatched. By
 * default a draft scores every token with a 2-bit copy of the head and
 * scores the best DRAFT_EXACT of those again with the model's own head
 * (draft_head.c): a proposal only has to be likely, and the greedy one is
 * the exact head's choice whenever that is among the 2-bit head's best.
 * Verification always uses the model's head. LS_SPEC_EXACT_DRAFT_HEAD
 * drafts with the model's head everywhere.
 *
 * Token masks (ls_spec_cycle_masked, structured output): the mask after a
 * path is asked of the caller's mask_fn when first needed, once per spine
 * row (path tok[1..i]) and per leaf the walk reaches. A draft at a position
 * draws from the masked draft logits, and the verifier from the masked
 * verifier logits with the same mask, so the accepted tokens are those
 * masked plain decoding gives (greedy) or has the distribution of
 * (sampled). A path no token may follow ends the verification there.
 *
 * Randomness (temperature > 0): the counter-based generator of sample.c,
 * counter = the position the token is for, in three streams derived from
 * the seed (draft draws, accept tests, residual draws); bonus tokens use
 * ls_sample's own stream, as plain decoding does. A position's uniforms
 * only influence the output in the cycle that commits that position, so
 * reusing a counter after a rejection never reuses randomness that
 * already shaped the output.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "draft_head.h"
#include "forward.h"
#include "kvcache.h"
#include "sampling.h"
#include "session_rules.h"
#include "testing.h" /* LS_SPEC_TEST_ACCEPT_ALL */

#define MAX_AHEAD 16   /* LS_SPEC_MAX_AHEAD */
#define MAX_BRANCH 16  /* LS_SPEC_MAX_BRANCHES */
#define MAX_NODES 64   /* LS_SPEC_MAX_NODES */
#define CHAIN_LD (LS_TREE_MAX_DEPTH + 1)
#define HEAD_GROUP 4   /* fewest verifier head rows per batch: one matmul tile of tokens */

_Static_assert(LS_SPEC_MAX_AHEAD == MAX_AHEAD && LS_SPEC_MAX_NODES == MAX_NODES &&
                   LS_SPEC_MAX_BRANCHES == MAX_BRANCH && LS_TREE_MAX_DEPTH >= MAX_AHEAD &&
                   LS_TREE_MAX_ROWS >= 1 + MAX_NODES && LS_CHUNK >= MAX_AHEAD + 1,
               "speculative limits out of step with loopserve.h / attention.h / sizes.h");

/* One cycle's settings, checked. */
typedef struct {
    int32_t D, V, k, K, exact_draft, accept_all;
    int32_t M, L;   /* min(D, V): loops every row runs first; max(D, V): loops the cycle's rows fill */
    float leaf_min_prob;
    ls_sampling sp;
    ls_mask_fn mask_fn; /* NULL: no token mask */
    void *mask_ctx;
} cycle;

// ---- scratch (the session's LS_SESSION_EXT_SPEC slot) ----

typedef struct {
    int32_t dim, vocab;
    int32_t last_accepted; /* draft tokens the previous cycle accepted (sizes the head batch) */
    float *h;        /* (LS_TREE_MAX_ROWS, dim) every row's hidden state: loop D, then loop V */
    float *hb;       /* (MAX_BRANCH, dim) one tree draft pass, gathered */
    float *hv;       /* (LS_TREE_MAX_ROWS, dim) the rows' head inputs: h through the coda (a draft's: row 0) */
    float *e;        /* (LS_TREE_MAX_ROWS, dim) tree rows' prelude outputs (models that keep them) */
    float *eb;       /* (MAX_BRANCH, dim) one tree draft pass's */
    float *dlogits;  /* (MAX_AHEAD, vocab) draft logits per depth (q for sampling) */
    float *vlogits;  /* (MAX_AHEAD + 1, vocab) verifier logits per spine row */
    float *alogits;  /* (vocab) verifier logits of one tree leaf */
    float *v;        /* (vocab) penalised logits */
    uint64_t *wp;    /* (vocab) integer weights of the verifier distribution */
    uint64_t *wq;    /* (vocab) integer weights of the draft distribution */
    int32_t *ids;    /* (vocab) rank scratch */
    uint32_t *masks; /* (MAX_AHEAD + 1, mask words) the mask after each spine row's path */
    uint32_t *leaf_mask; /* (mask words) the mask after a leaf's path */
    int32_t mask_state[MAX_AHEAD + 1]; /* per spine row: MASK_UNKNOWN, or mask_fn's answer */
    /* tree rows: 0 = pending token, 1..k spine, then leaves depth by depth */
    int32_t tok[LS_TREE_MAX_ROWS];
    int32_t depth[LS_TREE_MAX_ROWS];
    int32_t pos[LS_TREE_MAX_ROWS];
    int32_t slot[LS_TREE_MAX_ROWS];
    int32_t chain[LS_TREE_MAX_ROWS * CHAIN_LD];
    int32_t bpos[MAX_BRANCH], bslot[MAX_BRANCH], bchain[MAX_BRANCH * CHAIN_LD]; /* one draft pass */
} scratch;

static void scratch_free(void *state) {
    scratch *x = state;
    void *bufs[] = {x->h,  x->hb, x->hv, x->e,   x->eb,  x->dlogits, x->vlogits, x->alogits,
                    x->v,  x->wp, x->wq, x->ids, x->masks, x->leaf_mask, x};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

static scratch *scratch_of(const ls_session *s) { return s->ext[LS_SESSION_EXT_SPEC].state; }

static int32_t ensure_scratch(ls_session *s) {
    if (scratch_of(s)) return LS_OK;
    const ls_model_info *mi = &s->m->info;
    size_t dim = (size_t)mi->dim, V = (size_t)mi->vocab_size;
    scratch *x = calloc(1, sizeof *x);
    if (!x) return LS_ERR_NOMEM;
    x->dim = mi->dim;
    x->vocab = mi->vocab_size;
    x->last_accepted = MAX_AHEAD; /* first cycle: expect its drafts to be accepted */
    x->h = calloc(LS_TREE_MAX_ROWS * dim, sizeof(float));
    x->hb = calloc(MAX_BRANCH * dim, sizeof(float));
    x->hv = calloc(LS_TREE_MAX_ROWS * dim, sizeof(float));
    x->e = calloc(LS_TREE_MAX_ROWS * dim, sizeof(float));
    x->eb = calloc(MAX_BRANCH * dim, sizeof(float));
    x->dlogits = calloc(MAX_AHEAD * V, sizeof(float));
    x->vlogits = calloc((MAX_AHEAD + 1) * V, sizeof(float));
    x->alogits = calloc(V, sizeof(float));
    x->v = calloc(V, sizeof(float));
    x->wp = calloc(V, sizeof(uint64_t));
    x->wq = calloc(V, sizeof(uint64_t));
    x->ids = calloc(V, sizeof(int32_t));
    x->masks = calloc((MAX_AHEAD + 1) * ls_mask_words(mi->vocab_size), sizeof(uint32_t));
    x->leaf_mask = calloc(ls_mask_words(mi->vocab_size), sizeof(uint32_t));
    if (!x->h || !x->hb || !x->hv || !x->e || !x->eb || !x->dlogits || !x->vlogits || !x->alogits || !x->v ||
        !x->wp || !x->wq || !x->ids || !x->masks || !x->leaf_mask) {
        scratch_free(x);
        return LS_ERR_NOMEM;
    }
    s->ext[LS_SESSION_EXT_SPEC] = (ls_ext){x, scratch_free};
    return LS_OK;
}

// ---- randomness: ls_sample's generator, in separate streams ----

#define STREAM_DRAFT 0x6472616674ull    /* "draft" */
#define STREAM_ACCEPT 0x616363657074ull /* "accept" */
#define STREAM_RESID 0x7265736964ull    /* "resid" */

static uint64_t stream_seed(uint64_t seed, uint64_t stream) { return ls_mix64(seed ^ ls_mix64(stream)); }

// ---- token masks ----

#define MASK_UNKNOWN 2 /* not asked yet; mask_fn answers 1 (written), 0 (the path ended) or < 0 */

/* Masks logits by the mask after spine row i's path (tok[1..i]), asking
 * mask_fn the first time: 1 masked, 0 the path ended (logits untouched),
 * < 0 mask_fn's error. Without mask_fn: 1, nothing masked. */
static int32_t mask_spine(scratch *x, const cycle *c, int32_t i, float *logits) {
    if (!c->mask_fn) return 1;
    uint32_t *mask = x->masks + (size_t)i * ls_mask_words(x->vocab);
    if (x->mask_state[i] == MASK_UNKNOWN) x->mask_state[i] = c->mask_fn(c->mask_ctx, x->tok + 1, i, mask);
    if (x->mask_state[i] == 1) ls_mask_logits(logits, x->vocab, mask);
    return x->mask_state[i];
}

/* Masks logits by the mask after tree row u's path: its ancestors on the
 * spine, then its own token (as mask_spine answers). */
static int32_t mask_row(scratch *x, const cycle *c, int32_t u, int32_t depth, int32_t k, float *logits) {
    if (u <= k || !c->mask_fn) return mask_spine(x, c, depth, logits);
    int32_t path[MAX_AHEAD];
    memcpy(path, x->tok + 1, (size_t)(depth - 1) * sizeof *path);
    path[depth - 1] = x->tok[u];
    int32_t rc = c->mask_fn(c->mask_ctx, path, depth, x->leaf_mask);
    if (rc == 1) ls_mask_logits(logits, x->vocab, x->leaf_mask);
    return rc;
}

/* Keeps the candidates ids[0, n) the mask after spine row i allows (all
 * without a mask, or when that path ended); returns how many. */
static int32_t allowed_candidates(const scratch *x, const cycle *c, int32_t i, int32_t *ids, int32_t n) {
    if (!c->mask_fn || x->mask_state[i] != 1) return n;
    const uint32_t *mask = x->masks + (size_t)i * ls_mask_words(x->vocab);
    int32_t kept = 0;
    for (int32_t a = 0; a < n; a++)
        if ((mask[ids[a] / 32] >> (ids[a] % 32)) & 1u) ids[kept++] = ids[a];
    return kept;
}

// ---- sampling distributions ----

/* The greedy draft token among candidates ids[0, n): the best by
 * ls_penalise's value (the repetition penalty once if in the history). */
static int32_t best_candidate(const float *logits, const int32_t *ids, int32_t n, const int32_t *hist, int32_t n_hist,
                              float penalty) {
    float v[LS_DRAFT_BEST];
    int32_t best = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t t = ids[i], seen = 0;
        for (int32_t j = 0; j < n_hist && penalty != 1.0f && !seen; j++) seen = hist[j] == t;
        float l = logits[t] != logits[t] ? -INFINITY : logits[t];
        v[i] = seen ? ls_penalised(l, penalty) : l;
        if (v[i] > v[best] || (v[i] == v[best] && t < ids[best])) best = i;
    }
    return ids[best];
}

/* The n first-ranked ids of v, best first (n <= MAX_BRANCH), leaving out
 * -inf ones (masked) unless every one is. */
static int32_t top_ids(const float *v, int32_t vocab, int32_t n, int32_t *best) {
    int32_t have = 0;
    for (int32_t i = 0; i < vocab; i++) ls_rank_insert(v, i, best, &have, n < vocab ? n : vocab);
    while (have > 1 && v[best[have - 1]] == -INFINITY) have--;
    return have;
}

/* The distribution plain sampling draws from at this position
 * (ls_sample_weights), in w, its total in *z. */
static int32_t dist_weights(scratch *x, const float *logits, const int32_t *hist, int32_t n_hist, const cycle *c,
                            uint64_t *w, uint64_t *z) {
    return ls_sample_weights(logits, x->vocab, hist, n_hist, &c->sp, x->v, x->ids, w, z);
}

/* A draw from normalize(max(0, p - q)); from p if that is empty (p <= q
 * everywhere means p == q up to rounding, where a rejection cannot happen). */
static int32_t draw_residual(const uint64_t *wp, uint64_t zp, const uint64_t *wq, uint64_t zq, int32_t V, double u) {
    double ip = 1.0 / (double)zp, iq = 1.0 / (double)zq, total = 0.0;
    for (int32_t i = 0; i < V; i++) {
        double r = (double)wp[i] * ip - (double)wq[i] * iq;
        if (r > 0.0) total += r;
    }
    if (!(total > 0.0)) return ls_draw(wp, V, zp, u);
    double t = u * total, cum = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < V; i++) {
        double r = (double)wp[i] * ip - (double)wq[i] * iq;
        if (r <= 0.0) continue;
        cum += r;
        last = i;
        if (cum > t) return i;
    }
    return last; /* rounding left t at the very top */
}

// ---- draft proposals ----

#define DRAFT_EXACT LS_DRAFT_BEST /* coarse-head candidates the model's own head scores again */

/* Draft logits of the core's output h of position pos (through the coda,
 * in x->hv's first row, first): the coarse head's scores with the model's
 * own head at the coarse head's DRAFT_EXACT best (draft_head.c), whose ids
 * go to cand; returns how many. With exact set: the model's head everywhere
 * (LS_SPEC_EXACT_DRAFT_HEAD), and 0. */
static int32_t draft_logits(ls_session *s, const float *core, int32_t pos, float *logits, int32_t exact, int32_t *cand) {
    scratch *x = scratch_of(s);
    float *h = x->hv;
    memcpy(h, core, (size_t)x->dim * sizeof *h);
    ls_forward_finish(s, h, 1, pos, NULL, 0);
    if (exact) {
        ls_forward_logits(s, h, 1, logits);
        return 0;
    }
    ls_runtime *rt = s->m->rt;
    double t0 = ls_prof_now(rt);
    int32_t n = ls_draft_head_coarse(s->m, h, logits, cand, DRAFT_EXACT);
    ls_draft_head_exact(s->m, cand, n, logits);
    ls_prof_add(rt, LS_PROF_DRAFT_HEAD, &t0);
    return n;
}

// ---- the cycle ----

/* Rows of the verifier's head to compute next, starting at row r0 of
 * rows [0, n). The head streams vocab x dim weights from memory: up to a
 * tile of 4 rows costs about one row, each further row ~1/4 of one, and a
 * second batch the whole stream again. So the first batch covers the rows
 * the previous cycle's acceptance suggests will be needed (at least a
 * tile), and what is left goes in one more batch. Only the cost depends on
 * this, never a token. */
static int32_t head_batch(const scratch *x, int32_t r0, int32_t n) {
    int32_t want = r0 == 0 ? x->last_accepted + 2 : n - r0;
    if (want < HEAD_GROUP) want = HEAD_GROUP;
    return want < n - r0 ? want : n - r0;
}


/* Commits positions [p, p + n) (history already written) in loops [0, L) and the fixed units. */
static void commit(ls_session *s, int32_t L, int32_t p, int32_t n) {
    s->pos = p + n;
    for (int32_t l = -s->fixed; l < L; l++) s->unit_len[ls_unit_index(s->units, l)] = p + n;
}

/* The head inputs of rows [0, n) of x->h (the verifier's core outputs at
 * positions p.., or the tree rows): through the coda, into x->hv. */
static void verify_finish(ls_session *s, int32_t n, int32_t p, const ls_tree_rows *rows) {
    scratch *x = scratch_of(s);
    memcpy(x->hv, x->h, (size_t)n * x->dim * sizeof *x->hv);
    ls_forward_finish(s, x->hv, n, p, rows, 0);
}

/* Undoes a failed cycle: nothing past p was committed. */
static int32_t abandon(ls_session *s, int32_t L, int32_t p, int32_t rc) {
    commit(s, L, p, 0);
    return rc;
}

static int32_t run_chain(ls_session *s, const cycle *c, int32_t pending, int32_t *out, int32_t *stats, float *logits_out) {
    scratch *x = scratch_of(s);
    int32_t p = s->pos, dim = x->dim, V = x->vocab, k = c->k;
    int32_t sampled = c->sp.temperature > 0.0f;
    uint64_t seed_draft = stream_seed(c->sp.seed, STREAM_DRAFT);
    uint64_t seed_accept = stream_seed(c->sp.seed, STREAM_ACCEPT);
    uint64_t seed_resid = stream_seed(c->sp.seed, STREAM_RESID);
    int32_t *tok = x->tok;
    tok[0] = pending;

    // draft: one token at a time through units [0, D); with D > V the
    // loop-V state stays in h (the verifier's) and a copy goes on to loop D
    for (int32_t i = 0; i <= k; i++) {
        float *hi = x->h + (size_t)i * dim, *hd = c->D > c->V ? x->hb : hi;
        ls_forward_start(s, &tok[i], 1, p + i, NULL, hi);
        int32_t rc = ls_forward_units(s, hi, 1, p + i, 0, c->M);
        if (rc == LS_OK && hd != hi) {
            memcpy(hd, hi, (size_t)dim * sizeof *hd);
            rc = ls_forward_units(s, hd, 1, p + i, c->V, c->D);
        }
        if (rc != LS_OK) return abandon(s, c->L, p, rc);
        s->tokens[p + i] = tok[i];
        if (i == k) break;
        float *dl = x->dlogits + (size_t)i * V;
        int32_t cand[DRAFT_EXACT];
        int32_t n_cand = draft_logits(s, hd, p + i, dl, c->exact_draft, cand);
        rc = mask_spine(x, c, i, dl);
        if (rc < 0) return abandon(s, c->L, p, rc);
        n_cand = allowed_candidates(x, c, i, cand, n_cand);
        if (!sampled && n_cand > 0) {
            tok[i + 1] = best_candidate(dl, cand, n_cand, s->tokens, p + i + 1, c->sp.repetition_penalty);
        } else if (!sampled) {
            ls_penalise(x->v, dl, V, s->tokens, p + i + 1, c->sp.repetition_penalty);
            top_ids(x->v, V, 1, &tok[i + 1]);
        } else {
            uint64_t zq;
            rc = dist_weights(x, dl, s->tokens, p + i + 1, c, x->wq, &zq);
            if (rc != LS_OK) return abandon(s, c->L, p, rc);
            tok[i + 1] = ls_draw(x->wq, V, zq, ls_uniform(seed_draft, (uint64_t)(p + i + 1)));
        }
    }

    // verify: one batched pass over loops [D, V) from the kept loop-D states,
    // then the coda over every row at the verifier's depth
    if (c->V > c->D) {
        int32_t rc = ls_forward_units(s, x->h, k + 1, p, c->D, c->V);
        if (rc != LS_OK) return abandon(s, c->L, p, rc);
    }
    verify_finish(s, k + 1, p, NULL);

    // accept: head rows a group at a time, stopping at the first rejection
    // (or at a path no token may follow: `ended`, the drafts up to it kept)
    int32_t j = 0, next = -1, ended = 0;
    for (int32_t g0 = 0, gn; g0 <= k && next < 0 && !ended; g0 += gn) {
        gn = head_batch(x, g0, k + 1);
        ls_forward_logits(s, x->hv + (size_t)g0 * dim, gn, x->vlogits + (size_t)g0 * V);
        for (int32_t r = g0; r < g0 + gn; r++) {
            float *L = x->vlogits + (size_t)r * V;
            int32_t ms = mask_spine(x, c, r, L);
            if (ms < 0 || (ms == 0 && r == 0)) return abandon(s, c->L, p, ms < 0 ? ms : LS_ERR_ARG);
            if (ms == 0) {
                ended = 1;
                break;
            }
            uint64_t counter = (uint64_t)(p + r + 1); /* position of the token drawn here */
            int32_t n_hist = p + r + 1;
            if (!sampled || r == k) {
                /* greedy, or the bonus token: plain decoding's own draw */
                int32_t t = ls_sample(L, V, s->tokens, n_hist, &c->sp, counter);
                if (t < 0) return abandon(s, c->L, p, t);
                if (!sampled && r < k && t == tok[r + 1]) {
                    j++;
                    continue;
                }
                next = t;
                break;
            }
            uint64_t zp, zq;
            int32_t rc = dist_weights(x, L, s->tokens, n_hist, c, x->wp, &zp);
            if (rc == LS_OK) rc = dist_weights(x, x->dlogits + (size_t)r * V, s->tokens, n_hist, c, x->wq, &zq);
            if (rc != LS_OK) return abandon(s, c->L, p, rc);
            int32_t d = tok[r + 1];
            double pd = (double)x->wp[d] / (double)zp, qd = (double)x->wq[d] / (double)zq;
            if (c->accept_all || ls_uniform(seed_accept, counter) * qd < pd) {
                j++;
                continue;
            }
            next = draw_residual(x->wp, zp, x->wq, zq, V, ls_uniform(seed_resid, counter));
            break;
        }
    }

    const int32_t n_out = ended ? j : j + 1;
    for (int32_t i = 0; i < j; i++) out[i] = tok[i + 1];
    if (!ended) out[j] = next;
    /* rows 0..n_out-1 decided out[0..n_out-1] and are all still in vlogits */
    if (logits_out) memcpy(logits_out, x->vlogits, (size_t)n_out * V * sizeof(float));
    commit(s, c->L, p, n_out);
    x->last_accepted = j;
    if (stats) {
        stats[0] = k;
        stats[1] = j;
    }
    return n_out;
}

/* Verifier's token after tree row u, its logits in L; the history holds the
 * row's path (the caller wrote it). */
static int32_t verifier_token(ls_session *s, const cycle *c, const float *L, int32_t n_hist) {
    ls_sampling greedy = c->sp;
    greedy.temperature = 0.0f;
    return ls_sample(L, s->m->info.vocab_size, s->tokens, n_hist, &greedy, (uint64_t)n_hist);
}

/* Draft probabilities (softmax at temperature 1 of the penalised draft
 * logits v) of the n ranked candidates in ids, as far as deciding which
 * reach `floor` needs: the softmax over the candidates alone bounds each one
 * from above, so when even the second is below the floor (a confident
 * draft) those bounds decide every leaf without a pass over the vocabulary. */
static void draft_probs(const float *v, int32_t vocab, const int32_t *ids, int32_t n, float floor, float *prob) {
    float vmax = v[ids[0]];
    double zk = 0.0;
    for (int32_t i = 0; i < n; i++) zk += (double)expf(v[ids[i]] - vmax);
    if (n < 2 || (double)expf(v[ids[1]] - vmax) / zk < (double)floor) {
        for (int32_t i = 0; i < n; i++) prob[i] = (float)((double)expf(v[ids[i]] - vmax) / zk);
        return;
    }
    double z = 0.0;
    for (int32_t i = 0; i < vocab; i++) z += (double)expf(v[i] - vmax);
    for (int32_t i = 0; i < n; i++) prob[i] = (float)((double)expf(v[ids[i]] - vmax) / z);
}

static int32_t run_tree(ls_session *s, const cycle *c, int32_t pending, int32_t *out, int32_t *stats, float *logits_out) {
    scratch *x = scratch_of(s);
    int32_t p = s->pos, dim = x->dim, V = x->vocab, k = c->k, cap = s->cap;
    int32_t K = c->K < V ? c->K : V; /* a tiny vocabulary has fewer alternatives */
    int32_t *tok = x->tok;

    // layout: row 0 the pending token, rows 1..k the spine (natural slots),
    // then the leaves depth by depth as the draft finds them (leaf_at[i]..
    // leaf_at[i] + leaf_n[i] - 1 are depth i's), in the slots after the
    // spine's; rows are thus in ancestor-first order
    int32_t leaf_at[MAX_AHEAD + 1], leaf_n[MAX_AHEAD + 1];
    int32_t n_rows = k + 1;
    for (int32_t i = 0; i <= k; i++) {
        x->depth[i] = i;
        x->pos[i] = p + i;
        x->slot[i] = (p + i) % cap;
        for (int32_t q = 0; q <= i; q++) x->chain[i * CHAIN_LD + q] = (p + q) % cap;
    }

    // draft pass 0: the pending token alone, as in the chain (with D > V
    // the spine's loop-D state is kept in hb row 0, as the passes below leave it)
    tok[0] = pending;
    ls_forward_start(s, &tok[0], 1, p, NULL, x->h);
    if (s->e) memcpy(x->e, s->e + (size_t)p * dim, (size_t)dim * sizeof *x->e);
    int32_t rc = ls_forward_units(s, x->h, 1, p, 0, c->M);
    if (rc == LS_OK && c->D > c->V) {
        memcpy(x->hb, x->h, (size_t)dim * sizeof *x->hb);
        rc = ls_forward_units(s, x->hb, 1, p, c->V, c->D);
    }
    if (rc != LS_OK) return abandon(s, c->L, p, rc);
    s->tokens[p] = pending;
    int32_t best[MAX_BRANCH];
    float prob[MAX_BRANCH];
    for (int32_t i = 0; i < k; i++) {
        // proposals for depth i + 1 from the spine token at depth i: the best
        // draft token continues the spine, the next K - 1 (those the draft
        // gives at least leaf_min_prob) become leaves
        float *dl = x->dlogits;
        int32_t cand[DRAFT_EXACT];
        draft_logits(s, c->D > c->V ? x->hb : x->h + (size_t)i * dim, p + i, dl, c->exact_draft, cand);
        rc = mask_spine(x, c, i, dl);
        if (rc < 0) return abandon(s, c->L, p, rc);
        ls_penalise(x->v, dl, V, s->tokens, p + i + 1, c->sp.repetition_penalty);
        int32_t got = top_ids(x->v, V, K, best);
        if (c->leaf_min_prob > 0.0f) draft_probs(x->v, V, best, got, c->leaf_min_prob, prob);
        tok[i + 1] = best[0];
        int32_t d = i + 1;
        leaf_at[d] = n_rows;
        leaf_n[d] = 0;
        for (int32_t a = 1; a < got; a++) {
            if (c->leaf_min_prob > 0.0f && !(prob[a] >= c->leaf_min_prob)) break; /* ranked: the rest are smaller */
            int32_t u = n_rows++;
            leaf_n[d]++;
            tok[u] = best[a];
            x->depth[u] = d;
            x->pos[u] = p + d;
            x->slot[u] = (p + u) % cap;
            for (int32_t q = 0; q < d; q++) x->chain[u * CHAIN_LD + q] = (p + q) % cap;
            x->chain[u * CHAIN_LD + d] = x->slot[u];
        }

        // draft pass i + 1: spine token and its leaves, tree-masked
        int32_t nb = 1 + leaf_n[d], btok[MAX_BRANCH];
        for (int32_t b = 0; b < nb; b++) {
            int32_t u = b == 0 ? d : leaf_at[d] + b - 1;
            btok[b] = tok[u];
            x->bpos[b] = x->pos[u];
            x->bslot[b] = x->slot[u];
            memcpy(x->bchain + b * CHAIN_LD, x->chain + u * CHAIN_LD, CHAIN_LD * sizeof(int32_t));
        }
        ls_tree_rows pass = {x->bpos, x->bslot, x->bchain, CHAIN_LD, p, s->e ? x->eb : NULL};
        ls_forward_start(s, btok, nb, 0, &pass, x->hb);
        ls_forward_tree(s, x->hb, nb, &pass, 0, c->M);
        for (int32_t b = 0; b < nb; b++) {
            int32_t u = b == 0 ? d : leaf_at[d] + b - 1;
            memcpy(x->h + (size_t)u * dim, x->hb + (size_t)b * dim, dim * sizeof(float));
            memcpy(x->e + (size_t)u * dim, x->eb + (size_t)b * dim, dim * sizeof(float));
        }
        if (c->D > c->V) ls_forward_tree(s, x->hb, nb, &pass, c->V, c->D); /* leaves too: an accepted one keeps its rows */
        s->tokens[p + d] = tok[d];
    }

    // verify: every row through units [D, V) in one masked pass, then the coda
    ls_tree_rows all = {x->pos, x->slot, x->chain, CHAIN_LD, p, s->e ? x->e : NULL};
    if (c->V > c->D) ls_forward_tree(s, x->h, n_rows, &all, c->D, c->V);
    verify_finish(s, n_rows, p, &all);

    // walk: along the spine while the verifier agrees; at the first
    // disagreement a leaf holding the verifier's token is accepted too
    int32_t u = 0, j = 0, next = -1, g_end = 0, ended = 0;
    for (;;) {
        int32_t dep = x->depth[u];
        float *L;
        if (u <= k) {
            if (u >= g_end) {
                int32_t gn = head_batch(x, u, k + 1);
                ls_forward_logits(s, x->hv + (size_t)u * dim, gn, x->vlogits + (size_t)u * V);
                g_end = u + gn;
            }
            L = x->vlogits + (size_t)u * V;
        } else {
            ls_forward_logits(s, x->hv + (size_t)u * dim, 1, x->alogits);
            L = x->alogits;
            s->tokens[p + dep] = tok[u]; /* the leaf's path for the penalty */
        }
        int32_t ms = mask_row(x, c, u, dep, k, L);
        if (ms < 0 || (ms == 0 && u == 0)) return abandon(s, c->L, p, ms < 0 ? ms : LS_ERR_ARG);
        if (ms == 0) {
            ended = 1;
            break;
        }
        int32_t t = verifier_token(s, c, L, p + dep + 1);
        if (t < 0) return abandon(s, c->L, p, t);
        if (u < k) {
            if (t == tok[u + 1]) {
                u++;
                j++;
                continue;
            }
            int32_t found = -1;
            for (int32_t a = 0; a < leaf_n[u + 1] && found < 0; a++)
                if (tok[leaf_at[u + 1] + a] == t) found = leaf_at[u + 1] + a;
            if (found >= 0) {
                u = found;
                j++;
                continue;
            }
        }
        next = t;
        break;
    }

    // commit: a leaf's rows move from its slot to its position's slot (an
    // ended walk's last row is the next pending token, not fed: no move); the
    // path's prelude outputs become the session's
    if (u > k && !ended) {
        for (int32_t l = -s->fixed; l < c->L; l++) ls_kv_copy_row(s, l, (p + j) % cap, s, l, x->slot[u]);
        s->tokens[p + j] = tok[u];
    }
    for (int32_t q = 1; q <= j && s->e; q++)
        memcpy(s->e + (size_t)(p + q) * dim, x->e + (size_t)(q < j ? q : u) * dim, (size_t)dim * sizeof *s->e);
    // output: the accepted path (row 0 excluded), then the verifier's token;
    // every ancestor of the last row is a spine row, whose index is its depth
    const int32_t n_out = ended ? j : j + 1;
    for (int32_t i = 0; i + 1 < j; i++) out[i] = tok[i + 1];
    if (j > 0) out[j - 1] = tok[u];
    if (!ended) out[j] = next;
    /* out[i] was decided on the path's row at depth i: spine rows 0..j-1,
     * then the last row (spine row j, or the accepted leaf's own logits) */
    if (logits_out) {
        memcpy(logits_out, x->vlogits, (size_t)j * V * sizeof(float));
        if (!ended)
            memcpy(logits_out + (size_t)j * V, u <= k ? x->vlogits + (size_t)u * V : x->alogits, (size_t)V * sizeof(float));
    }
    commit(s, c->L, p, n_out);
    x->last_accepted = j;
    /* leaves wrote ring slots up to position p + n_rows - 1 */
    for (int32_t l = -s->fixed; l < c->L; l++) {
        const int32_t i = ls_unit_index(s->units, l);
        if (p + n_rows - cap > s->unit_lo[i]) s->unit_lo[i] = p + n_rows - cap;
    }
    if (stats) {
        stats[0] = n_rows - 1;
        stats[1] = j;
    }
    return n_out;
}

int32_t ls_spec_cycle(ls_session *s, int32_t pending, const ls_spec_params *prm, int32_t *out_tokens,
                      int32_t *out_stats) {
    return ls_spec_cycle_logits(s, pending, prm, out_tokens, out_stats, NULL);
}

int32_t ls_spec_cycle_logits(ls_session *s, int32_t pending, const ls_spec_params *prm, int32_t *out_tokens,
                             int32_t *out_stats, float *logits_out) {
    return ls_spec_cycle_masked(s, pending, prm, NULL, NULL, out_tokens, out_stats, logits_out);
}

int32_t ls_spec_cycle_masked(ls_session *s, int32_t pending, const ls_spec_params *prm, ls_mask_fn mask_fn,
                             void *mask_ctx, int32_t *out_tokens, int32_t *out_stats, float *logits_out) {
    if (!s || !prm || !out_tokens) return LS_ERR_ARG;
    const ls_model_info *mi = &s->m->info;
    cycle c = {
        .D = prm->draft_loops,
        .V = prm->verify_loops,
        .K = prm->k_branches,
        .exact_draft = (prm->flags & LS_SPEC_EXACT_DRAFT_HEAD) != 0,
        .accept_all = (prm->flags & LS_SPEC_TEST_ACCEPT_ALL) != 0,
        .leaf_min_prob = prm->leaf_min_prob,
        .sp = prm->sampling,
        .mask_fn = mask_fn,
        .mask_ctx = mask_ctx,
    };
    /* the cycle runs cache units: a step is the model's n_layers of them */
    const int64_t layers = mi->n_layers;
    if (c.D < 1 || c.V < 1 || c.D * layers > s->units || c.V * layers > s->units) return LS_ERR_ARG;
    c.D *= (int32_t)layers;
    c.V *= (int32_t)layers;
    c.M = c.D < c.V ? c.D : c.V;
    c.L = c.D > c.V ? c.D : c.V;
    if (prm->draft_ahead < 1 || prm->draft_ahead > MAX_AHEAD || c.K < 1 || c.K > MAX_BRANCH ||
        c.K * prm->draft_ahead > MAX_NODES || prm->max_new < 1)
        return LS_ERR_ARG;
    if (pending < 0 || pending >= mi->vocab_size) return LS_ERR_ARG;
    if (prm->reserved != 0 || !ls_sampling_ok(&c.sp)) return LS_ERR_ARG;
    if (c.K > 1 && c.sp.temperature != 0.0f) return LS_ERR_ARG; /* tree speculation is greedy only */
    /* ...and needs the plain fp16 cache: an accepted leaf's rows are moved
     * into place as fp16 rows, so the compressed modes are refused) */
    if (c.K > 1 && s->kv_mode != LS_KV_FP16) return LS_ERR_ARG;
    if ((prm->flags & ~(LS_SPEC_EXACT_DRAFT_HEAD | LS_SPEC_TEST_ACCEPT_ALL)) != 0) return LS_ERR_ARG;
    if (!(c.leaf_min_prob >= 0.0f && c.leaf_min_prob <= 1.0f)) return LS_ERR_ARG;

    int32_t p = s->pos;
    if (s->cache_steps > 0) return LS_ERR_ARG; /* a verify pass would read drafted rows a plain step does not */
    if (!ls_units_ready(ls_session_view(s), c.V)) return LS_ERR_STATE;
    c.k = prm->draft_ahead < prm->max_new - 1 ? prm->draft_ahead : prm->max_new - 1;
    if (c.k == 0) c.K = 1;
    /* every row of the cycle needs its own position (tree leaves: their own
     * slot) below max_seq; the ring (window + LS_CHUNK rows) then never
     * overwrites a row the cycle or the next one reads */
    if (p + 1 + c.k * c.K > s->max_seq) return LS_ERR_FULL;
    int32_t rc = ls_session_reserve(s, p + 1 + c.k * c.K);
    /* units earlier exact exits deferred: as deep as the draft goes where they exist that deep */
    if (rc == LS_OK) rc = ls_forward_settle(s, ls_units_ready(ls_session_view(s), c.L) ? c.L : c.V);
    if (rc == LS_OK && c.D > c.V) rc = ls_forward_deepen(s, c.V, c.D);
    if (rc == LS_OK) rc = ensure_scratch(s);
    if (rc == LS_OK && !c.exact_draft && c.k > 0) rc = ls_draft_head_build(s->m);
    if (rc != LS_OK) return rc;
    scratch *x = scratch_of(s);
    for (int32_t i = 0; i <= MAX_AHEAD; i++) x->mask_state[i] = MASK_UNKNOWN;
    return c.K == 1 ? run_chain(s, &c, pending, out_tokens, out_stats, logits_out)
                    : run_tree(s, &c, pending, out_tokens, out_stats, logits_out);
}
