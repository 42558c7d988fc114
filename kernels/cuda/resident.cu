/*
 * resident.cu — LS_CUDA_KERNELS_RESIDENT's L2 policy. A looped model reads
 * its block's weights once a loop, so a block that fits the L2 cache's
 * persisting set-aside need not come from memory again; the head, read
 * once a token, streams past (evict first) and leaves the rest alone.
 *
 * At load each layer's buffers are gathered into one allocation (an
 * access policy window is one address range), the set-aside is sized to
 * what the layers need up to the device's limit, and the layers take it
 * in order, each window's hit ratio the share of its bytes that still
 * fits: a stack's layers are each read once a step, so none is more
 * re-used than another, and the first ones are pinned first. Eager
 * launches read the window from the per-thread stream's attribute; a
 * captured step's kernel nodes are given theirs one by one after the
 * capture (marks taken during it say where each layer's launches begin),
 * so replays carry them whatever the capture copied from the stream.
 *
 * Only where bytes are cached changes: every kernel reads the same values
 * in the same order, so the bits are those of the family off.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

/* A window's base rounded to 256 bytes, as each buffer of an arena starts. */
#define LSC_ARENA_ALIGN 256

struct lsc_resident {
    cudaAccessPolicyWindow *layers; /* (n_layers) num_bytes 0: no window */
    cudaAccessPolicyWindow head;
    int32_t n_layers;
    size_t l2, max_persisting, max_window, setaside, pinned, gathered;
    int stream_windows; /* the per-thread stream takes the window attribute */
    /* the capture of a step: after node marks[i].after (NULL: from the start) the launches read marks[i].which */
    struct {
        cudaGraphNode_t after;
        int32_t which;
    } *marks;
    int32_t n_marks, cap_marks;
    int capturing, marks_lost;
    /* over the captured steps */
    int64_t graphs, nodes_set, nodes_carried, graphs_unmarked;
    char note[160]; /* the first thing that did not work, or "" */
};

static void note(lsc_resident *r, const char *what, cudaError_t e) {
    if (!r->note[0]) snprintf(r->note, sizeof r->note, "%s: %s", what, cudaGetErrorString(e));
    cudaGetLastError(); // leaves no sticky error for the launches after
}

static size_t aligned(size_t bytes) { return (bytes + LSC_ARENA_ALIGN - 1) / LSC_ARENA_ALIGN * LSC_ARENA_ALIGN; }

/* Moves a layer's buffers into one allocation, each at the offset its
 * predecessors leave; the layer as it was when memory runs short. */
static bool gather_layer(lsc_layer *l, const ls_model_info *mi, lsc_resident *r) {
    void **slots[LSC_LAYER_BUFFERS];
    size_t bytes[LSC_LAYER_BUFFERS], total = 0;
    const int n = lsc_layer_buffers(l, mi, slots, bytes);
    for (int i = 0; i < n; i++) total += aligned(bytes[i]);
    char *arena = NULL;
    cudaError_t e = cudaMalloc((void **)&arena, total);
    for (size_t i = 0, at = 0; e == cudaSuccess && i < (size_t)n; at += aligned(bytes[i]), i++)
        e = cudaMemcpy(arena + at, *slots[i], bytes[i], cudaMemcpyDeviceToDevice);
    if (e != cudaSuccess) {
        if (arena) cudaFree(arena);
        note(r, "gathering a layer's weights", e);
        return false;
    }
    for (size_t i = 0, at = 0; i < (size_t)n; at += aligned(bytes[i]), i++) {
        cudaFree(*slots[i]);
        *slots[i] = arena + at;
    }
    l->arena = arena;
    l->arena_bytes = total;
    return true;
}

static int device_attr(cudaDeviceAttr a, int dev) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, a, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return v;
}

static cudaError_t set_stream_window(const cudaAccessPolicyWindow *w) {
    cudaStreamAttrValue v;
    memset(&v, 0, sizeof v);
    v.accessPolicyWindow = *w;
    return cudaStreamSetAttribute(cudaStreamPerThread, cudaStreamAttributeAccessPolicyWindow, &v);
}

void lsc_resident_init(ls_model *m) {
    ls_runtime *rt = m->rt;
    const ls_model_info *mi = &m->info;
    lsc_resident *r = (lsc_resident *)calloc(1, sizeof *r);
    if (r) r->layers = (cudaAccessPolicyWindow *)calloc((size_t)mi->n_layers, sizeof *r->layers);
    if (!r || !r->layers) {
        free(r);
        return;
    }
    rt->resident = r;
    r->n_layers = mi->n_layers;
    r->l2 = (size_t)device_attr(cudaDevAttrL2CacheSize, rt->device);
    r->max_persisting = (size_t)device_attr(cudaDevAttrMaxPersistingL2CacheSize, rt->device);
    r->max_window = (size_t)device_attr(cudaDevAttrMaxAccessPolicyWindowSize, rt->device);
    if (r->max_persisting == 0 || r->max_window == 0) {
        snprintf(r->note, sizeof r->note, "the device has no persisting L2 set-aside");
        return;
    }
    size_t want = 0;
    for (int32_t i = 0; i < mi->n_layers; i++)
        if (gather_layer(&rt->layers[i], mi, r)) {
            r->gathered++;
            want += rt->layers[i].arena_bytes < r->max_window ? rt->layers[i].arena_bytes : r->max_window;
        }
    r->setaside = want < r->max_persisting ? want : r->max_persisting;
    cudaError_t e = cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, r->setaside);
    if (e == cudaSuccess) e = cudaDeviceGetLimit(&r->setaside, cudaLimitPersistingL2CacheSize);
    if (e != cudaSuccess) {
        note(r, "setting the persisting L2 size", e);
        r->setaside = 0;
    }
    /* the layers in order take what is left of the set-aside */
    size_t left = r->setaside;
    for (int32_t i = 0; i < mi->n_layers; i++) {
        const lsc_layer *l = &rt->layers[i];
        if (!l->arena || left == 0) continue;
        const size_t span = l->arena_bytes < r->max_window ? l->arena_bytes : r->max_window;
        const size_t take = span < left ? span : left;
        r->layers[i] = cudaAccessPolicyWindow{l->arena, span, (float)((double)take / (double)span),
                                              cudaAccessPropertyPersisting, cudaAccessPropertyStreaming};
        left -= take;
        r->pinned += take;
    }
    /* the head: read once a token, it streams */
    const void *head = rt->output ? (const void *)rt->output : rt->qhead ? (const void *)rt->qhead->qweight : NULL;
    const size_t head_bytes = rt->output ? (size_t)mi->vocab_size * mi->dim * sizeof(__half)
                              : rt->qhead ? (size_t)rt->qhead->rows * (size_t)lsq_row_bytes(rt->qhead->in, rt->qhead->bits)
                                          : 0;
    if (head)
        r->head = cudaAccessPolicyWindow{const_cast<void *>(head), head_bytes < r->max_window ? head_bytes : r->max_window,
                                         1.0f, cudaAccessPropertyStreaming, cudaAccessPropertyNormal};
    e = set_stream_window(&r->layers[0]);
    r->stream_windows = e == cudaSuccess;
    if (e != cudaSuccess) note(r, "the per-thread stream's window", e);
}

void lsc_resident_free(ls_runtime *rt) {
    lsc_resident *r = rt->resident;
    if (!r) return;
    if (r->stream_windows) {
        const cudaAccessPolicyWindow none = {NULL, 0, 0.0f, cudaAccessPropertyNormal, cudaAccessPropertyNormal};
        if (set_stream_window(&none) != cudaSuccess) cudaGetLastError();
    }
    /* this model's lines leave the set-aside as normal ones */
    if (r->setaside > 0 && cudaCtxResetPersistingL2Cache() != cudaSuccess) cudaGetLastError();
    free(r->marks);
    free(r->layers);
    free(r);
    rt->resident = NULL;
}

static const cudaAccessPolicyWindow *window_of(const lsc_resident *r, int32_t which) {
    return which == LSC_HEAD ? &r->head : &r->layers[which];
}

/* The node the capture will hang the next launch on (NULL: none yet); false when it is not one node. */
static bool capture_tail(cudaGraphNode_t *tail) {
    cudaStreamCaptureStatus status;
    const cudaGraphNode_t *deps = NULL;
    size_t n = 0;
#if CUDART_VERSION >= 13000
    cudaError_t e = cudaStreamGetCaptureInfo(cudaStreamPerThread, &status, NULL, NULL, &deps, NULL, &n);
#else
    cudaError_t e = cudaStreamGetCaptureInfo(cudaStreamPerThread, &status, NULL, NULL, &deps, &n);
#endif
    if (e != cudaSuccess || status != cudaStreamCaptureStatusActive || n > 1) return false;
    *tail = n == 1 ? deps[0] : NULL;
    return true;
}

void lsc_resident_use(const ls_model *m, int32_t which) {
    lsc_resident *r = m->rt->resident;
    if (!r) return;
    if (r->capturing) {
        cudaGraphNode_t tail;
        if (r->n_marks == r->cap_marks) {
            int32_t cap = r->cap_marks ? 2 * r->cap_marks : 64;
            void *grown = realloc(r->marks, (size_t)cap * sizeof *r->marks);
            if (!grown) {
                r->marks_lost = 1;
                return;
            }
            r->marks = (decltype(r->marks))grown;
            r->cap_marks = cap;
        }
        if (!capture_tail(&tail)) r->marks_lost = 1;
        else r->marks[r->n_marks++] = {tail, which};
        return;
    }
    cudaError_t e = r->stream_windows ? set_stream_window(window_of(r, which)) : cudaSuccess;
    if (e != cudaSuccess) {
        r->stream_windows = 0;
        note(r, "the per-thread stream's window", e);
    }
}

void lsc_resident_capture_begin(const ls_model *m) {
    lsc_resident *r = m->rt->resident;
    if (!r) return;
    r->capturing = 1;
    r->n_marks = 0;
    r->marks_lost = 0;
}

/* The one node after `node` in a captured chain; NULL at its end or where it branches (*branched). */
static cudaGraphNode_t next_in_chain(cudaGraphNode_t node, bool *branched) {
    size_t n = 0;
    cudaGraphNode_t next = NULL;
    if (cudaGraphNodeGetDependentNodes(node, NULL, NULL, &n) != cudaSuccess || n > 1) {
        *branched = true;
        return NULL;
    }
    if (n == 1 && cudaGraphNodeGetDependentNodes(node, &next, NULL, &n) != cudaSuccess) {
        *branched = true;
        return NULL;
    }
    return next;
}

void lsc_resident_graph(const ls_model *m, cudaGraph_t graph) {
    lsc_resident *r = m->rt->resident;
    if (!r) return;
    r->capturing = 0;
    if (!graph) return; /* the capture failed */
    r->graphs++;
    cudaGraphNode_t node = NULL;
    size_t roots = 1;
    /* one stream's capture is a chain: its nodes in launch order */
    if (r->marks_lost || cudaGraphGetRootNodes(graph, &node, &roots) != cudaSuccess || roots != 1) {
        cudaGetLastError();
        r->graphs_unmarked++;
        return;
    }
    int32_t k = 0, which = -2; /* -2: no window (the embedding) */
    while (k < r->n_marks && r->marks[k].after == NULL) which = r->marks[k++].which;
    bool branched = false;
    for (; node; node = next_in_chain(node, &branched)) {
        cudaGraphNodeType type;
        if (which != -2 && window_of(r, which)->num_bytes > 0 && cudaGraphNodeGetType(node, &type) == cudaSuccess &&
            type == cudaGraphNodeTypeKernel) {
            cudaKernelNodeAttrValue v;
            if (cudaGraphKernelNodeGetAttribute(node, cudaKernelNodeAttributeAccessPolicyWindow, &v) == cudaSuccess &&
                v.accessPolicyWindow.num_bytes > 0)
                r->nodes_carried++;
            memset(&v, 0, sizeof v);
            v.accessPolicyWindow = *window_of(r, which);
            cudaError_t e = cudaGraphKernelNodeSetAttribute(node, cudaKernelNodeAttributeAccessPolicyWindow, &v);
            if (e == cudaSuccess) r->nodes_set++;
            else note(r, "a kernel node's window", e);
        }
        while (k < r->n_marks && r->marks[k].after == node) which = r->marks[k++].which;
    }
    if (branched || k < r->n_marks) r->graphs_unmarked++;
    cudaGetLastError();
}

extern "C" int64_t ls_cuda_resident_report(const ls_model *m, char *report, int32_t report_len) {
    if (!m || !m->rt || !report || report_len < 1) return LS_ERR_ARG;
    const lsc_resident *r = m->rt->resident;
    if (!r) {
        snprintf(report, (size_t)report_len, "off: the family was not enabled when the model loaded");
        return 0;
    }
    const double MB = 1048576.0;
    const lsc_layer *l0 = &m->rt->layers[0];
    snprintf(report, (size_t)report_len,
             "L2 %.1f MB, persisting at most %.1f MB, windows at most %.1f MB; set-aside %.1f MB; %zu of %d layers "
             "gathered (layer 0: %.1f MB, hit ratio %.3f); %.1f MB pinned; head window %.1f MB streaming; stream "
             "windows %s; %lld captured steps, %lld kernel nodes given a window (%lld had one from the stream), "
             "%lld steps unmarked%s%s",
             r->l2 / MB, r->max_persisting / MB, r->max_window / MB, r->setaside / MB, r->gathered, r->n_layers,
             l0->arena_bytes / MB, r->layers[0].hitRatio, r->pinned / MB, r->head.num_bytes / MB,
             r->stream_windows ? "on" : "off", (long long)r->graphs, (long long)r->nodes_set,
             (long long)r->nodes_carried, (long long)r->graphs_unmarked, r->note[0] ? "; " : "", r->note);
    return (int64_t)r->pinned;
}
