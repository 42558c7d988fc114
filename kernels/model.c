/*
 * model.c — maps and validates a loopserve .safetensors file (docs/model-format.md).
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON, then the
 * data region; each tensor's data_offsets are relative to the data region.
 * The file is untrusted: everything is checked before a single weight is
 * used, and each failure names the field or tensor and what was expected.
 * Weights are never copied: ls_weights points into the read-only mapping.
 */
#define _DEFAULT_SOURCE /* mmap, fstat under -std=c11 */

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "json.h"
#include "quant.h"
#include "session.h" /* LS_CHUNK: rows per matmul call, for the activation scratch */

/* The safetensors reference reader's own limit; real headers are kilobytes. */
#define HEADER_MAX ((uint64_t)100 * 1000 * 1000)

// ---- messages ----

// Copies untrusted text into buf for an error message: control bytes become
// '?', long text is cut with "...", so a hostile name cannot garble the log.
static const char *shown(const char *s, size_t len, char *buf, size_t cap) {
    size_t max = cap - 4, m = len < max ? len : max;
    for (size_t i = 0; i < m; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (len > max) memcpy(buf + m, "...", 4);
    else buf[m] = '\0';
    return buf;
}

// "[64, 32]" from expected dimensions.
static void fmt_dims(char *buf, size_t cap, const int64_t *dims, int n) {
    size_t at = 0;
    at += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

// "[64, 32]" from a JSON array, whatever it holds (it is being reported as wrong).
static void fmt_json_array(char *buf, size_t cap, const ls_json_doc *doc, uint32_t arr) {
    size_t at = (size_t)snprintf(buf, cap, "[");
    uint32_t k = arr + 1;
    for (uint32_t i = 0; i < doc->nodes[arr].count && at < cap; i++) {
        const ls_json_node *n = &doc->nodes[k];
        const char *sep = i ? ", " : "";
        if (i == 8) {
            at += (size_t)snprintf(buf + at, cap - at, ", ...");
            break;
        }
        if (n->type == LS_JSON_NUMBER && n->is_int)
            at += (size_t)snprintf(buf + at, cap - at, "%s%lld", sep, (long long)n->i);
        else if (n->type == LS_JSON_NUMBER)
            at += (size_t)snprintf(buf + at, cap - at, "%s%g", sep, n->d);
        else
            at += (size_t)snprintf(buf + at, cap - at, "%s<%s>", sep, ls_json_type_name(n->type));
        k = n->next;
    }
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

// "an object", "a string", ... for "is %s, expected ...".
static const char *kind(ls_json_type t) {
    switch (t) {
    case LS_JSON_OBJECT: return "an object";
    case LS_JSON_ARRAY: return "an array";
    case LS_JSON_NULL: return "null";
    default: break;
    }
    return t == LS_JSON_STRING ? "a string" : t == LS_JSON_NUMBER ? "a number" : "a boolean";
}

// ---- metadata ----

typedef struct {
    const ls_json_doc *doc;
    uint32_t meta; /* the __metadata__ object */
    char *err;
    int32_t err_len;
} meta_reader;

// The string value of a required metadata key, or NULL with err written.
static const ls_json_node *meta_str(meta_reader *r, const char *key) {
    uint32_t v = ls_json_get(r->doc, r->meta, key);
    if (v == LS_JSON_NONE) {
        ls_set_error(r->err, r->err_len, "metadata '%s' missing", key);
        return NULL;
    }
    const ls_json_node *n = &r->doc->nodes[v];
    if (n->type != LS_JSON_STRING) {
        ls_set_error(r->err, r->err_len,
                     "metadata '%s' is %s, expected a string (safetensors metadata values are strings)",
                     key, kind(n->type));
        return NULL;
    }
    return n;
}

static int meta_expect(meta_reader *r, const char *key, const char *want) {
    const ls_json_node *n = meta_str(r, key);
    if (!n) return -1;
    if (n->len != strlen(want) || memcmp(n->str, want, n->len) != 0) {
        char b[80];
        ls_set_error(r->err, r->err_len, "metadata '%s' is '%s', expected '%s'", key,
                     shown(n->str, n->len, b, sizeof b), want);
        return -1;
    }
    return 0;
}

// Decimal digits only ("0" or no leading zero): "+5", " 5", "5.0", "0x5" are
// refused so a typo never loads as some other number.
static int meta_int(meta_reader *r, const char *key, int64_t lo, int64_t hi, int32_t *out) {
    const ls_json_node *n = meta_str(r, key);
    if (!n) return -1;
    int ok = n->len > 0 && n->len <= 18 && !(n->len > 1 && n->str[0] == '0');
    int64_t v = 0;
    for (uint32_t i = 0; ok && i < n->len; i++) {
        if (n->str[i] < '0' || n->str[i] > '9') ok = 0;
        else v = v * 10 + (n->str[i] - '0');
    }
    char b[80];
    if (!ok) {
        ls_set_error(r->err, r->err_len, "metadata '%s' is '%s', expected an integer in %lld..%lld",
                     key, shown(n->str, n->len, b, sizeof b), (long long)lo, (long long)hi);
        return -1;
    }
    if (v < lo || v > hi) {
        ls_set_error(r->err, r->err_len, "metadata '%s' is %lld, expected %lld..%lld", key,
                     (long long)v, (long long)lo, (long long)hi);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

// A positive finite number below `hi`, as fp32 (what the kernels use).
static int meta_float(meta_reader *r, const char *key, double hi, float *out) {
    const ls_json_node *n = meta_str(r, key);
    if (!n) return -1;
    double d;
    char b[80];
    if (ls_parse_decimal(n->str, n->len, &d) != 0) {
        ls_set_error(r->err, r->err_len, "metadata '%s' is '%s', expected a number", key,
                     shown(n->str, n->len, b, sizeof b));
        return -1;
    }
    float f = (float)d;
    if (!(f > 0.0f) || !isfinite(f) || !(d < hi)) {
        ls_set_error(r->err, r->err_len, "metadata '%s' is '%s', expected a positive number below %g",
                     key, shown(n->str, n->len, b, sizeof b), hi);
        return -1;
    }
    *out = f;
    return 0;
}

static int read_metadata(const ls_json_doc *doc, uint32_t root, ls_model_info *info, char *err,
                         int32_t err_len) {
    uint32_t meta = ls_json_get(doc, root, "__metadata__");
    if (meta == LS_JSON_NONE) {
        ls_set_error(err, err_len, "metadata missing: the header has no '__metadata__' object");
        return -1;
    }
    if (doc->nodes[meta].type != LS_JSON_OBJECT) {
        ls_set_error(err, err_len, "'__metadata__' is %s, expected an object",
                     kind(doc->nodes[meta].type));
        return -1;
    }
    meta_reader r = {doc, meta, err, err_len};
    int32_t version;
    if (meta_expect(&r, "format", "loopserve") != 0) return -1;
    if (meta_int(&r, "format_version", 1, 1000000, &version) != 0) return -1;
    if (version != 1) {
        ls_set_error(err, err_len, "metadata 'format_version' is %d, this build reads version 1",
                     version);
        return -1;
    }
    if (meta_expect(&r, "arch", "looped-llama") != 0) return -1;

    // Caps keep every size product far from overflow and reject garbage early.
    if (meta_int(&r, "dim", 1, 65536, &info->dim) != 0) return -1;
    if (meta_int(&r, "n_heads", 1, 4096, &info->n_heads) != 0) return -1;
    if (meta_int(&r, "n_kv_heads", 1, 4096, &info->n_kv_heads) != 0) return -1;
    if (meta_int(&r, "ffn_dim", 1, 262144, &info->ffn_dim) != 0) return -1;
    if (meta_int(&r, "vocab_size", 1, 1 << 20, &info->vocab_size) != 0) return -1;
    if (meta_int(&r, "default_loops", 1, 64, &info->default_loops) != 0) return -1;
    if (meta_int(&r, "max_seq_len", 1, 1 << 20, &info->max_seq_len) != 0) return -1;
    if (meta_float(&r, "rope_theta", 1e12, &info->rope_theta) != 0) return -1;
    if (meta_float(&r, "norm_eps", 1.0, &info->norm_eps) != 0) return -1;

    const ls_json_node *q = meta_str(&r, "quant");
    if (!q) return -1;
    if (q->len == 4 && memcmp(q->str, "fp16", 4) == 0) {
        info->quant = LS_QUANT_FP16;
    } else if (q->len == 4 && memcmp(q->str, "int4", 4) == 0) {
        info->quant = LS_QUANT_INT4;
    } else if (q->len == 4 && memcmp(q->str, "int2", 4) == 0) {
        info->quant = LS_QUANT_INT2;
    } else {
        char b[80];
        ls_set_error(err, err_len, "quant '%s' is not supported by this build (it reads fp16, int4 and int2)",
                     shown(q->str, q->len, b, sizeof b));
        return -1;
    }
    int32_t group_size;
    if (meta_int(&r, "group_size", 0, 65536, &group_size) != 0) return -1;
    if (info->quant == LS_QUANT_FP16) {
        info->group_size = 0; // fp16 has no groups, whatever the writer recorded
    } else if (!ls_quant_group_ok(group_size)) {
        ls_set_error(err, err_len, "metadata 'group_size' is %d, expected 32, 64, 128 or 256 for quant %s",
                     group_size, info->quant == LS_QUANT_INT4 ? "int4" : "int2");
        return -1;
    } else {
        info->group_size = group_size;
    }
    if (meta_expect(&r, "tokenizer", "gpt2") != 0) return -1;

    if (info->dim % info->n_heads != 0) {
        ls_set_error(err, err_len, "metadata inconsistent: dim %d is not divisible by n_heads %d",
                     info->dim, info->n_heads);
        return -1;
    }
    info->head_dim = info->dim / info->n_heads;
    if (info->head_dim % 2 != 0) {
        ls_set_error(err, err_len,
                     "metadata inconsistent: head_dim %d (dim %d / n_heads %d) must be even for RoPE",
                     info->head_dim, info->dim, info->n_heads);
        return -1;
    }
    if (info->n_heads % info->n_kv_heads != 0) {
        ls_set_error(err, err_len,
                     "metadata inconsistent: n_heads %d is not divisible by n_kv_heads %d",
                     info->n_heads, info->n_kv_heads);
        return -1;
    }
    // Quantization groups run along each matrix's inputs: dim (wq, wk, wv,
    // wo, w1, w3, output) and ffn_dim (w2).
    if (info->quant != LS_QUANT_FP16) {
        const char *field = NULL;
        int32_t value = 0;
        if (info->dim % info->group_size != 0) field = "dim", value = info->dim;
        else if (info->ffn_dim % info->group_size != 0) field = "ffn_dim", value = info->ffn_dim;
        if (field != NULL) {
            ls_set_error(err, err_len,
                         "metadata inconsistent: %s %d is not a multiple of group_size %d (quantization "
                         "groups run along each matrix's inputs)",
                         field, value, info->group_size);
            return -1;
        }
    }
    return 0;
}

// ---- tensors ----

typedef struct {
    char name[64]; /* copied: quantized tensor names are formatted on the fly */
    uint64_t begin, end;
    int64_t cols;  /* F16 tensors: the last dimension (for row/column in messages); 0 otherwise */
} span;

typedef struct {
    const ls_json_doc *doc;
    uint32_t root;
    const uint8_t *data;   /* start of the data region in the map */
    uint64_t data_len;     /* bytes in the data region */
    uint64_t data_at;      /* file offset of the data region */
    span spans[40]; /* every tensor of a quantized model: 4 + 7 * 3 + 2 */
    int n_spans;
    char *err;
    int32_t err_len;
} tensor_reader;

// Finds `name`, checks it is of `dtype` (elements of esize bytes) with
// exactly `dims`, inside the data region and aligned, and returns a pointer
// into the map. Returns 0, 1 if absent and optional, or -1 with err written.
static int get_tensor_as(tensor_reader *t, const char *name, const char *dtype, int esize,
                         const int64_t *dims, int n_dims, int optional, const void **out) {
    const ls_json_doc *doc = t->doc;
    uint32_t v = ls_json_get(doc, t->root, name);
    if (v == LS_JSON_NONE) {
        if (optional) return 1;
        ls_set_error(t->err, t->err_len, "tensor '%s' missing from the header", name);
        return -1;
    }
    if (doc->nodes[v].type != LS_JSON_OBJECT) {
        ls_set_error(t->err, t->err_len, "tensor '%s': entry is %s, expected an object", name,
                     kind(doc->nodes[v].type));
        return -1;
    }
    char want[96], got[160], b[80];
    fmt_dims(want, sizeof want, dims, n_dims);

    uint32_t dt = ls_json_get(doc, v, "dtype");
    if (dt == LS_JSON_NONE || doc->nodes[dt].type != LS_JSON_STRING) {
        ls_set_error(t->err, t->err_len, "tensor '%s': 'dtype' %s, expected \"%s\"", name,
                     dt == LS_JSON_NONE ? "missing" : "is not a string", dtype);
        return -1;
    }
    const ls_json_node *dn = &doc->nodes[dt];
    if (dn->len != strlen(dtype) || memcmp(dn->str, dtype, dn->len) != 0) {
        ls_set_error(t->err, t->err_len, "tensor '%s': dtype '%s' expected %s", name,
                     shown(dn->str, dn->len, b, sizeof b), dtype);
        return -1;
    }

    uint32_t sh = ls_json_get(doc, v, "shape");
    if (sh == LS_JSON_NONE || doc->nodes[sh].type != LS_JSON_ARRAY) {
        ls_set_error(t->err, t->err_len, "tensor '%s': 'shape' %s, expected %s", name,
                     sh == LS_JSON_NONE ? "missing" : "is not an array", want);
        return -1;
    }
    int same = doc->nodes[sh].count == (uint32_t)n_dims;
    uint32_t k = sh + 1;
    for (uint32_t i = 0; i < doc->nodes[sh].count; i++) {
        const ls_json_node *e = &doc->nodes[k];
        if (e->type != LS_JSON_NUMBER || !e->is_int || e->i < 0) {
            fmt_json_array(got, sizeof got, doc, sh);
            ls_set_error(t->err, t->err_len,
                         "tensor '%s': shape %s is not a list of non-negative integers", name, got);
            return -1;
        }
        if (same && e->i != dims[i]) same = 0;
        k = e->next;
    }
    if (!same) {
        fmt_json_array(got, sizeof got, doc, sh);
        ls_set_error(t->err, t->err_len, "tensor '%s': shape %s expected %s", name, got, want);
        return -1;
    }

    uint32_t off = ls_json_get(doc, v, "data_offsets");
    if (off == LS_JSON_NONE || doc->nodes[off].type != LS_JSON_ARRAY) {
        ls_set_error(t->err, t->err_len, "tensor '%s': 'data_offsets' %s, expected [begin, end]",
                     name, off == LS_JSON_NONE ? "missing" : "is not an array");
        return -1;
    }
    fmt_json_array(got, sizeof got, doc, off);
    const ls_json_node *nb = NULL, *ne = NULL;
    if (doc->nodes[off].count == 2) {
        nb = &doc->nodes[off + 1];
        ne = &doc->nodes[nb->next];
    }
    if (nb == NULL || nb->type != LS_JSON_NUMBER || !nb->is_int || ne->type != LS_JSON_NUMBER ||
        !ne->is_int) {
        ls_set_error(t->err, t->err_len,
                     "tensor '%s': data_offsets %s, expected two integers [begin, end]", name, got);
        return -1;
    }
    if (nb->i < 0 || ne->i < 0) {
        ls_set_error(t->err, t->err_len, "tensor '%s': data_offsets %s has a negative offset", name,
                     got);
        return -1;
    }
    uint64_t begin = (uint64_t)nb->i, end = (uint64_t)ne->i;
    if (begin > end) {
        ls_set_error(t->err, t->err_len, "tensor '%s': data_offsets %s has begin > end", name, got);
        return -1;
    }
    if (end > t->data_len) {
        ls_set_error(t->err, t->err_len,
                     "tensor '%s': data_offsets %s past end of data (%llu bytes)", name, got,
                     (unsigned long long)t->data_len);
        return -1;
    }
    // dims are capped by the metadata checks (<= 2^20 * 2^18), so no overflow.
    uint64_t want_bytes = (uint64_t)esize;
    for (int i = 0; i < n_dims; i++) want_bytes *= (uint64_t)dims[i];
    if (end - begin != want_bytes) {
        ls_set_error(t->err, t->err_len,
                     "tensor '%s': data_offsets %s hold %llu bytes, expected %llu (%s %s)", name,
                     got, (unsigned long long)(end - begin), (unsigned long long)want_bytes, dtype,
                     want);
        return -1;
    }
    if ((t->data_at + begin) % (uint64_t)esize != 0) {
        ls_set_error(t->err, t->err_len,
                     "tensor '%s': data at file offset %llu is not %d-byte aligned for %s", name,
                     (unsigned long long)(t->data_at + begin), esize, dtype);
        return -1;
    }
    if (t->n_spans < (int)(sizeof t->spans / sizeof t->spans[0])) {
        span *sp = &t->spans[t->n_spans++];
        snprintf(sp->name, sizeof sp->name, "%s", name);
        sp->begin = begin;
        sp->end = end;
        sp->cols = strcmp(dtype, "F16") == 0 && n_dims > 0 ? dims[n_dims - 1] : 0;
    }
    *out = (const void *)(t->data + begin);
    return 0;
}

static int get_tensor(tensor_reader *t, const char *name, const int64_t *dims, int n_dims,
                      int optional, const uint16_t **out) {
    const void *p = NULL;
    int rc = get_tensor_as(t, name, "F16", 2, dims, n_dims, optional, &p);
    if (rc == 0) *out = (const uint16_t *)p;
    return rc;
}

static int has_tensor(const tensor_reader *t, const char *name) {
    return ls_json_get(t->doc, t->root, name) != LS_JSON_NONE;
}

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

// Element sizes of every dtype the safetensors format defines.
static int dtype_size(const ls_json_node *n) {
    static const struct {
        const char *name;
        int size;
    } known[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
                 {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                 {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (n->len == strlen(known[i].name) && memcmp(n->str, known[i].name, n->len) == 0) return known[i].size;
    return 0;
}

// Every entry of the header, the model's tensors and any other, must be
// well-formed (docs/model-format.md): metadata values are strings; each
// tensor is an object with a known dtype, a shape of non-negative integers
// and data_offsets holding exactly its bytes inside the data region; no two
// tensors share bytes. Extra tensors are otherwise ignored, but a header
// that lies about one is a corrupt file, refused as the safetensors reader
// would refuse it.
static int check_entries(tensor_reader *t) {
    const ls_json_doc *doc = t->doc;
    const ls_json_node *root = &doc->nodes[t->root];
    char b[80], got[160];
    span *all = calloc(root->count ? root->count : 1, sizeof *all);
    if (!all) {
        ls_set_error(t->err, t->err_len, "out of memory checking the header's tensors");
        return -1;
    }
    int n = 0, rc = -1;
    for (uint32_t i = 0, k = t->root + 1; i < root->count; i++) {
        const ls_json_node *key = &doc->nodes[k];
        uint32_t v = k + 1;
        const ls_json_node *e = &doc->nodes[v];
        k = e->next;
        const char *name = shown(key->str, key->len, b, sizeof b);
        if (key->len == 12 && memcmp(key->str, "__metadata__", 12) == 0) {
            for (uint32_t j = 0, mk = v + 1; e->type == LS_JSON_OBJECT && j < e->count; j++) {
                const ls_json_node *mv = &doc->nodes[mk + 1];
                if (mv->type != LS_JSON_STRING) {
                    ls_set_error(t->err, t->err_len, "metadata '%s' is %s, expected a string (safetensors metadata values are strings)",
                                 shown(doc->nodes[mk].str, doc->nodes[mk].len, got, sizeof got), kind(mv->type));
                    goto done;
                }
                mk = mv->next;
            }
            continue;
        }
        if (e->type != LS_JSON_OBJECT) {
            ls_set_error(t->err, t->err_len, "tensor '%s': entry is %s, expected an object", name, kind(e->type));
            goto done;
        }
        uint32_t dt = ls_json_get(doc, v, "dtype"), sh = ls_json_get(doc, v, "shape"), off = ls_json_get(doc, v, "data_offsets");
        int esize = dt != LS_JSON_NONE && doc->nodes[dt].type == LS_JSON_STRING ? dtype_size(&doc->nodes[dt]) : 0;
        if (esize == 0) {
            ls_set_error(t->err, t->err_len, "tensor '%s': dtype %s is not a safetensors dtype", name,
                         dt == LS_JSON_NONE ? "missing" : doc->nodes[dt].type == LS_JSON_STRING ? shown(doc->nodes[dt].str, doc->nodes[dt].len, got, sizeof got) : "not a string");
            goto done;
        }
        if (sh == LS_JSON_NONE || doc->nodes[sh].type != LS_JSON_ARRAY) {
            ls_set_error(t->err, t->err_len, "tensor '%s': 'shape' %s, expected an array of integers", name,
                         sh == LS_JSON_NONE ? "missing" : "is not an array");
            goto done;
        }
        uint64_t bytes = (uint64_t)esize;
        int too_big = 0;
        for (uint32_t d = 0, dk = sh + 1; d < doc->nodes[sh].count; d++) {
            const ls_json_node *dim = &doc->nodes[dk];
            if (dim->type != LS_JSON_NUMBER || !dim->is_int || dim->i < 0) {
                fmt_json_array(got, sizeof got, doc, sh);
                ls_set_error(t->err, t->err_len, "tensor '%s': shape %s is not a list of non-negative integers", name, got);
                goto done;
            }
            if (__builtin_mul_overflow(bytes, (uint64_t)dim->i, &bytes)) too_big = 1;
            dk = dim->next;
        }
        const ls_json_node *nb = NULL, *ne = NULL;
        if (off != LS_JSON_NONE && doc->nodes[off].type == LS_JSON_ARRAY && doc->nodes[off].count == 2) {
            nb = &doc->nodes[off + 1];
            ne = &doc->nodes[nb->next];
        }
        if (nb == NULL || nb->type != LS_JSON_NUMBER || !nb->is_int || nb->i < 0 || ne->type != LS_JSON_NUMBER ||
            !ne->is_int || ne->i < nb->i) {
            if (off != LS_JSON_NONE && doc->nodes[off].type == LS_JSON_ARRAY) fmt_json_array(got, sizeof got, doc, off);
            else snprintf(got, sizeof got, "%s", off == LS_JSON_NONE ? "missing" : "not an array");
            ls_set_error(t->err, t->err_len, "tensor '%s': data_offsets %s, expected two integers 0 <= begin <= end", name, got);
            goto done;
        }
        uint64_t begin = (uint64_t)nb->i, end = (uint64_t)ne->i;
        fmt_json_array(got, sizeof got, doc, off);
        if (end > t->data_len) {
            ls_set_error(t->err, t->err_len, "tensor '%s': data_offsets %s past end of data (%llu bytes)", name, got,
                         (unsigned long long)t->data_len);
            goto done;
        }
        if (too_big || end - begin != bytes) {
            ls_set_error(t->err, t->err_len, "tensor '%s': data_offsets %s hold %llu bytes, not what its dtype and shape need",
                         name, got, (unsigned long long)(end - begin));
            goto done;
        }
        snprintf(all[n].name, sizeof all[n].name, "%s", name);
        all[n].begin = begin;
        all[n].end = end;
        n++;
    }
    // Overlapping tensors cannot be a valid export; they point at a corrupt
    // or hand-edited header, which is better refused than half-trusted.
    qsort(all, (size_t)n, sizeof all[0], span_cmp);
    for (int i = 1; i < n; i++) {
        const span *a = &all[i - 1], *c = &all[i];
        if (c->begin < a->end) {
            ls_set_error(t->err, t->err_len, "tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap", a->name,
                         (unsigned long long)a->begin, (unsigned long long)a->end, c->name, (unsigned long long)c->begin,
                         (unsigned long long)c->end);
            goto done;
        }
    }
    rc = 0;
done:
    free(all);
    return rc;
}

// Index of the first Inf or NaN among n fp16 values, or -1. An fp16 value is
// not finite when its exponent bits are all ones: (h & 0x7c00) + 0x0400 then
// carries into bit 15, so blocks are OR-reduced without a branch (the
// compiler vectorizes the block loop) and only a block with a hit is searched.
static int64_t first_nonfinite_f16(const uint16_t *p, uint64_t n) {
    enum { BLOCK = 256 };
    uint64_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        uint16_t acc = 0;
        for (int j = 0; j < BLOCK; j++) acc |= (uint16_t)((p[i + j] & 0x7c00) + 0x0400);
        if (acc & 0x8000) break;
    }
    for (; i < n; i++)
        if ((p[i] & 0x7c00) == 0x7c00) return (int64_t)i;
    return -1;
}

// Weights that are Inf or NaN make every logit NaN: the model would load,
// report healthy and fail every request. Every F16 tensor the loader took
// (fp16 weights, norms, quantization scales and offsets) is scanned once;
// the message names the tensor and where in it.
static int check_finite(tensor_reader *t) {
    for (int s = 0; s < t->n_spans; s++) {
        const span *sp = &t->spans[s];
        if (sp->cols == 0) continue;
        const uint16_t *p = (const uint16_t *)(const void *)(t->data + sp->begin);
        int64_t at = first_nonfinite_f16(p, (sp->end - sp->begin) / 2);
        if (at < 0) continue;
        uint16_t h = p[at];
        const char *what = (h & 0x03ff) ? "NaN" : (h & 0x8000) ? "-Inf" : "+Inf";
        ls_set_error(t->err, t->err_len,
                     "tensor '%s' holds a non-finite value (%s) at element %lld (row %lld, column %lld): "
                     "the weights are corrupt",
                     sp->name, what, (long long)at, (long long)(at / sp->cols), (long long)(at % sp->cols));
        return -1;
    }
    return 0;
}

// One quantized matrix `base` (e.g. "block.wq") of rows x in: base.qweight
// (U8 codes, or I8 for the int8 head), base.scales (F16) and, for int2,
// base.zeros (F16); base.weight must not also be there.
static int get_qmat(tensor_reader *t, const char *base, int64_t rows, int64_t in, int32_t group,
                    int32_t bits, ls_qmat *q) {
    char name[64];
    snprintf(name, sizeof name, "%s.weight", base);
    if (has_tensor(t, name)) {
        ls_set_error(t->err, t->err_len,
                     "tensor '%s' present in a quantized model: expected '%s.qweight' and '%s.scales' "
                     "instead",
                     name, base, base);
        return -1;
    }
    const void *p;
    const int64_t d_q[2] = {rows, in * bits / 8}, d_s[2] = {rows, in / group};
    snprintf(name, sizeof name, "%s.qweight", base);
    if (get_tensor_as(t, name, bits == 8 ? "I8" : "U8", 1, d_q, 2, 0, &p) != 0) return -1;
    q->qweight = p;
    snprintf(name, sizeof name, "%s.scales", base);
    if (get_tensor_as(t, name, "F16", 2, d_s, 2, 0, &p) != 0) return -1;
    q->scales = p;
    q->zeros = NULL;
    if (bits == 2) {
        snprintf(name, sizeof name, "%s.zeros", base);
        if (get_tensor_as(t, name, "F16", 2, d_s, 2, 0, &p) != 0) return -1;
        q->zeros = p;
    }
    q->rows = (int32_t)rows;
    q->in = (int32_t)in;
    q->group = group;
    q->bits = bits;
    q->act = NULL;    /* set once the scratch exists */
    q->packed = NULL; /* made by ls_quant_setup at runtime init (quant.h) */
    return 0;
}

// The block's seven matrices of a quantized model, and its output head:
// output.weight (F16), output.qweight + output.scales (int8), or neither (tied).
static int read_quant_tensors(tensor_reader *t, const ls_model_info *in, ls_weights *w,
                              ls_qmat *qm, int32_t *tied) {
    const int64_t dim = in->dim, hd = in->head_dim, ffn = in->ffn_dim, vocab = in->vocab_size;
    const int64_t q_rows = in->n_heads * hd, kv_rows = in->n_kv_heads * hd;
    const int32_t G = in->group_size, bits = in->quant == LS_QUANT_INT4 ? 4 : 2;
    if (get_qmat(t, "block.wq", q_rows, dim, G, bits, &qm[0]) != 0) return -1;
    if (get_qmat(t, "block.wk", kv_rows, dim, G, bits, &qm[1]) != 0) return -1;
    if (get_qmat(t, "block.wv", kv_rows, dim, G, bits, &qm[2]) != 0) return -1;
    if (get_qmat(t, "block.wo", dim, q_rows, G, bits, &qm[3]) != 0) return -1;
    if (get_qmat(t, "block.w1", ffn, dim, G, bits, &qm[4]) != 0) return -1;
    if (get_qmat(t, "block.w2", dim, ffn, G, bits, &qm[5]) != 0) return -1;
    if (get_qmat(t, "block.w3", ffn, dim, G, bits, &qm[6]) != 0) return -1;
    w->qwq = &qm[0], w->qwk = &qm[1], w->qwv = &qm[2], w->qwo = &qm[3];
    w->qw1 = &qm[4], w->qw2 = &qm[5], w->qw3 = &qm[6];
    w->wq = w->wk = w->wv = w->wo = w->w1 = w->w2 = w->w3 = NULL;

    const int64_t d_emb[2] = {vocab, dim};
    int has_q = has_tensor(t, "output.qweight"), has_f = has_tensor(t, "output.weight");
    *tied = 0;
    w->qoutput = NULL;
    if (has_q && has_f) {
        ls_set_error(t->err, t->err_len,
                     "tensors 'output.weight' and 'output.qweight' both present: the output head is "
                     "either fp16 or int8");
        return -1;
    } else if (has_q) {
        if (get_qmat(t, "output", vocab, dim, G, 8, &qm[7]) != 0) return -1;
        w->qoutput = &qm[7];
        w->output = NULL;
    } else if (has_f) {
        if (get_tensor(t, "output.weight", d_emb, 2, 0, &w->output) != 0) return -1;
    } else {
        *tied = 1;
        w->output = w->tok_embeddings;
    }
    return 0;
}

static int read_tensors(tensor_reader *t, const ls_model_info *in, ls_weights *w, ls_qmat *qm,
                        int32_t *tied) {
    const int64_t dim = in->dim, hd = in->head_dim, ffn = in->ffn_dim, vocab = in->vocab_size;
    const int64_t q_rows = in->n_heads * hd, kv_rows = in->n_kv_heads * hd;
    const int64_t d_emb[2] = {vocab, dim}, d_vec[1] = {dim};
    const int64_t d_q[2] = {q_rows, dim}, d_kv[2] = {kv_rows, dim}, d_o[2] = {dim, q_rows};
    const int64_t d_up[2] = {ffn, dim}, d_down[2] = {dim, ffn};

    if (get_tensor(t, "tok_embeddings.weight", d_emb, 2, 0, &w->tok_embeddings) != 0) return -1;
    if (in->quant != LS_QUANT_FP16) {
        if (get_tensor(t, "block.attn_norm.weight", d_vec, 1, 0, &w->attn_norm) != 0) return -1;
        if (get_tensor(t, "block.ffn_norm.weight", d_vec, 1, 0, &w->ffn_norm) != 0) return -1;
        if (get_tensor(t, "norm.weight", d_vec, 1, 0, &w->norm) != 0) return -1;
        return read_quant_tensors(t, in, w, qm, tied);
    }
    if (get_tensor(t, "block.attn_norm.weight", d_vec, 1, 0, &w->attn_norm) != 0) return -1;
    if (get_tensor(t, "block.wq.weight", d_q, 2, 0, &w->wq) != 0) return -1;
    if (get_tensor(t, "block.wk.weight", d_kv, 2, 0, &w->wk) != 0) return -1;
    if (get_tensor(t, "block.wv.weight", d_kv, 2, 0, &w->wv) != 0) return -1;
    if (get_tensor(t, "block.wo.weight", d_o, 2, 0, &w->wo) != 0) return -1;
    if (get_tensor(t, "block.ffn_norm.weight", d_vec, 1, 0, &w->ffn_norm) != 0) return -1;
    if (get_tensor(t, "block.w1.weight", d_up, 2, 0, &w->w1) != 0) return -1;
    if (get_tensor(t, "block.w2.weight", d_down, 2, 0, &w->w2) != 0) return -1;
    if (get_tensor(t, "block.w3.weight", d_up, 2, 0, &w->w3) != 0) return -1;
    if (get_tensor(t, "norm.weight", d_vec, 1, 0, &w->norm) != 0) return -1;
    int rc = get_tensor(t, "output.weight", d_emb, 2, 1, &w->output);
    if (rc < 0) return -1;
    *tied = rc == 1;
    if (*tied) w->output = w->tok_embeddings;
    return 0;
}

// ---- mapping ----

#ifdef LS_LOAD_TO_HEAP
/* Sanitizer builds (test/kernels/asan.test.ts) read the file into a heap
 * buffer of exactly its size instead: AddressSanitizer does not track mapped
 * pages, so only this way does a read one byte past the file get reported. */
static void *map_file(int fd, size_t size) {
    unsigned char *p = malloc(size);
    if (p == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    for (size_t done = 0; done < size;) {
        ssize_t r = pread(fd, p + done, size - done, (off_t)done);
        if (r <= 0) {
            if (r == 0) errno = EIO; // the file shrank under us
            free(p);
            return NULL;
        }
        done += (size_t)r;
    }
    return p;
}
static void unmap_file(void *p, size_t size) {
    (void)size;
    free(p);
}
#else
static void *map_file(int fd, size_t size) {
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}
static void unmap_file(void *p, size_t size) { munmap(p, size); }
#endif

// ---- load / free ----

// Everything from the mapped bytes to a filled model, before the runtime starts.
static int validate(const uint8_t *map, uint64_t size, ls_model *m, char *err, int32_t err_len) {
    if (size < 8) {
        ls_set_error(err, err_len, "file is %llu bytes, too short for the 8-byte header length",
                     (unsigned long long)size);
        return -1;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | map[i];
    if (n > size - 8) {
        ls_set_error(err, err_len, "header length %llu exceeds file size %llu",
                     (unsigned long long)n, (unsigned long long)size);
        return -1;
    }
    if (n > HEADER_MAX) {
        ls_set_error(err, err_len, "header length %llu exceeds the %llu-byte limit",
                     (unsigned long long)n, (unsigned long long)HEADER_MAX);
        return -1;
    }

    ls_json_doc doc;
    char jerr[200];
    if (ls_json_parse(&doc, (const char *)map + 8, (size_t)n, jerr, sizeof jerr) != 0) {
        ls_set_error(err, err_len, "header JSON invalid: %s of the header", jerr);
        return -1;
    }
    int rc = -1;
    tensor_reader t = {0};
    t.doc = &doc;
    t.root = 0;
    t.data = map + 8 + n;
    t.data_len = size - 8 - n;
    t.data_at = 8 + n;
    t.err = err;
    t.err_len = err_len;
    if (doc.nodes[0].type != LS_JSON_OBJECT) {
        ls_set_error(err, err_len, "header JSON is %s, expected an object",
                     kind(doc.nodes[0].type));
    } else if (read_metadata(&doc, 0, &m->info, err, err_len) == 0 &&
               read_tensors(&t, &m->info, &m->w, m->qmats, &m->info.tied_output) == 0 &&
               check_entries(&t) == 0 && check_finite(&t) == 0) {
        rc = 0;
    }
    ls_json_free(&doc);
    return rc;
}

// Opens and maps the file at path; NULL with err written on failure.
static void *open_and_map(const char *path, size_t *size_out, char *err, int32_t err_len) {
    if (path == NULL) {
        ls_set_error(err, err_len, "no model path given");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ls_set_error(err, err_len, "cannot open model file '%s': %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ls_set_error(err, err_len, "cannot stat model file '%s': %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        ls_set_error(err, err_len, "model path '%s' is not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size < 8) {
        ls_set_error(err, err_len, "file is %lld bytes, too short for the 8-byte header length",
                     (long long)st.st_size);
        close(fd);
        return NULL;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        ls_set_error(err, err_len, "model file '%s' is too large to map", path);
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    void *map = map_file(fd, size);
    int map_errno = errno;
    close(fd); // the mapping keeps the file alive
    if (map == NULL) {
        ls_set_error(err, err_len, "cannot map model file '%s': %s", path, strerror(map_errno));
        return NULL;
    }
    *size_out = size;
    return map;
}

int32_t ls_model_check(const char *path, ls_model_info *info, char *err, int32_t err_len) {
    ls_set_error(err, err_len, "%s", "");
    size_t size = 0;
    void *map = open_and_map(path, &size, err, err_len);
    if (map == NULL) return LS_ERR_ARG;
    ls_model m;
    memset(&m, 0, sizeof m);
    int rc = validate(map, size, &m, err, err_len);
    unmap_file(map, size);
    if (rc != 0) return LS_ERR_ARG;
    if (info) *info = m.info;
    return LS_OK;
}

ls_model *ls_model_load(const char *path, int32_t n_threads, int32_t simd, char *err,
                        int32_t err_len) {
    ls_set_error(err, err_len, "%s", "");
    if (simd < LS_SIMD_AUTO || simd > LS_SIMD_AVX512) {
        ls_set_error(err, err_len, "simd %d is not one of LS_SIMD_AUTO/PORTABLE/AVX2/AVX512", simd);
        return NULL;
    }
    size_t size = 0;
    void *map = open_and_map(path, &size, err, err_len);
    if (map == NULL) return NULL;

    ls_model *m = calloc(1, sizeof *m);
    if (!m) {
        ls_set_error(err, err_len, "out of memory allocating the model");
        unmap_file(map, size);
        return NULL;
    }
    m->map = map;
    m->map_len = size;
    if (validate(map, size, m, err, err_len) != 0) {
        unmap_file(map, size);
        free(m);
        return NULL;
    }
    if (m->info.quant != LS_QUANT_FP16) {
        // One activation scratch for every quantized matrix: a matmul call
        // carries at most LS_CHUNK rows of at most max(dim, ffn_dim) inputs.
        int32_t widest = m->info.dim > m->info.ffn_dim ? m->info.dim : m->info.ffn_dim;
        m->qact = ls_qact_new(LS_CHUNK, widest);
        if (!m->qact) {
            ls_set_error(err, err_len, "out of memory allocating the quantized-activation scratch");
            unmap_file(map, size);
            free(m);
            return NULL;
        }
        ls_qact_attach(m->qact, m->qmats, (int32_t)(sizeof m->qmats / sizeof m->qmats[0]));
    }
    // ls_runtime_init overwrites these with what it actually starts.
    m->info.simd = simd;
    m->info.n_threads = n_threads;
    m->rt = NULL;
    if (ls_runtime_init(m, n_threads, simd, err, err_len) < 0) {
        if (err != NULL && err_len > 0 && err[0] == '\0')
            ls_set_error(err, err_len, "runtime initialisation failed");
        ls_qact_free(m->qact);
        unmap_file(map, size);
        free(m);
        return NULL;
    }
    return m;
}

void ls_model_free(ls_model *m) {
    if (m == NULL) return;
    ls_runtime_free(m);
    ls_qact_free(m->qact);
    if (m->map != NULL) unmap_file(m->map, m->map_len);
    free(m);
}

void ls_model_info_get(const ls_model *m, ls_model_info *out) {
    if (m == NULL || out == NULL) return;
    *out = m->info;
}
