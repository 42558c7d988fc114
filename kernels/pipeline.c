/*
 * pipeline.c — pipelined steps: ls_pipeline_begin / ls_pipeline_end
 * (docs/serving-overhead.md).
 *
 * ls_batch_step on a thread of the model's own, so the caller's thread is
 * free while the step runs: a server streams the previous step's tokens
 * meanwhile. The step is the library's own ls_batch_step, called with the
 * caller's arrays as given, so its results are bit-identical to calling it
 * directly. Both libraries link this file.
 *
 * One step at a time per model: begin hands it over, end waits for it. The
 * thread starts at the first begin and is joined by ls_model_free. A step
 * with token masks waits between its forward pass and its draws until the
 * caller has made the masks ready (ls_pipeline_masks_ready, or end).
 */
#include <pthread.h>
#include <stdlib.h>

#include "internal.h"

enum { IDLE, QUEUED, DONE, QUIT };

typedef struct ls_pipeline {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;
    /* the call handed over (valid while QUEUED) */
    ls_model *m;
    ls_session *const *sessions;
    const ls_batch_row *rows;
    int32_t n_rows;
    const int32_t *tokens;
    const uint32_t *masks;
    float *logits_out;
    int32_t *out;
    int32_t rc;
    int masks_ready; /* the caller wrote the masks: the draws may read them */
} ls_pipeline;

/* The step's gate (ls_batch_step_gated): the draws wait for the masks. */
static void wait_for_masks(void *arg) {
    ls_pipeline *st = arg;
    pthread_mutex_lock(&st->mu);
    while (!st->masks_ready) pthread_cond_wait(&st->cv, &st->mu);
    pthread_mutex_unlock(&st->mu);
}

static void *pipeline_thread(void *arg) {
    ls_pipeline *st = arg;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (st->state != QUEUED && st->state != QUIT) pthread_cond_wait(&st->cv, &st->mu);
        if (st->state == QUIT) break;
        pthread_mutex_unlock(&st->mu);
        int32_t rc = ls_batch_step_gated(st->m, st->sessions, st->rows, st->n_rows, st->tokens, st->masks,
                                         st->logits_out, st->out, st->masks ? wait_for_masks : NULL, st);
        pthread_mutex_lock(&st->mu);
        st->rc = rc;
        st->state = DONE;
        pthread_cond_broadcast(&st->cv);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

static ls_pipeline *pipeline_of(ls_model *m) {
    if (m->pipeline != NULL) return m->pipeline;
    ls_pipeline *st = calloc(1, sizeof *st);
    if (st == NULL) return NULL;
    st->state = IDLE;
    if (pthread_mutex_init(&st->mu, NULL) != 0) goto fail_mu;
    if (pthread_cond_init(&st->cv, NULL) != 0) goto fail_cv;
    if (pthread_create(&st->thread, NULL, pipeline_thread, st) != 0) goto fail_thread;
    m->pipeline = st;
    return st;
fail_thread:
    pthread_cond_destroy(&st->cv);
fail_cv:
    pthread_mutex_destroy(&st->mu);
fail_mu:
    free(st);
    return NULL;
}

int32_t ls_pipeline_begin(ls_model *m, ls_session *const *sessions, const ls_batch_row *rows, int32_t n_rows,
                          const int32_t *tokens, const uint32_t *masks, float *logits_out, int32_t *out) {
    if (m == NULL) return LS_ERR_ARG;
    ls_pipeline *st = pipeline_of(m);
    if (st == NULL) return LS_ERR_NOMEM;
    pthread_mutex_lock(&st->mu);
    int32_t rc = LS_OK;
    if (st->state != IDLE) {
        rc = LS_ERR_STATE; /* the step begun before has not been ended */
    } else {
        st->m = m;
        st->sessions = sessions;
        st->rows = rows;
        st->n_rows = n_rows;
        st->tokens = tokens;
        st->masks = masks;
        st->masks_ready = masks == NULL;
        st->logits_out = logits_out;
        st->out = out;
        st->state = QUEUED;
        pthread_cond_broadcast(&st->cv);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/* Lets the begun step's draws read its masks; LS_ERR_STATE when none was begun. */
static int32_t release_masks(ls_pipeline *st) {
    if (st->state == IDLE) return LS_ERR_STATE;
    st->masks_ready = 1;
    pthread_cond_broadcast(&st->cv);
    return LS_OK;
}

/* Releases the begun step's masks and, with `wait`, waits for the step and
 * returns its result; LS_ERR_STATE when nothing was begun. */
static int32_t release(ls_model *m, int wait) {
    if (m == NULL) return LS_ERR_ARG;
    ls_pipeline *st = m->pipeline;
    if (st == NULL) return LS_ERR_STATE;
    pthread_mutex_lock(&st->mu);
    int32_t rc = release_masks(st);
    if (rc == LS_OK && wait) {
        while (st->state != DONE) pthread_cond_wait(&st->cv, &st->mu);
        rc = st->rc;
        st->state = IDLE;
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int32_t ls_pipeline_masks_ready(ls_model *m) { return release(m, 0); }

int32_t ls_pipeline_end(ls_model *m) { return release(m, 1); }

void ls_pipeline_free(ls_model *m) {
    ls_pipeline *st = m->pipeline;
    if (st == NULL) return;
    pthread_mutex_lock(&st->mu);
    st->masks_ready = 1; /* a step waiting for its masks draws with them as they are */
    pthread_cond_broadcast(&st->cv);
    while (st->state == QUEUED) pthread_cond_wait(&st->cv, &st->mu); /* a step still running finishes first */
    st->state = QUIT;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    pthread_join(st->thread, NULL);
    pthread_cond_destroy(&st->cv);
    pthread_mutex_destroy(&st->mu);
    free(st);
    m->pipeline = NULL;
}
