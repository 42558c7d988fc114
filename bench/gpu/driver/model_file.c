// Safetensors for the driver: a loopserve file's descriptor (what the
// TypeScript loader passes the library, src/engine/model_descriptor.ts:
// the metadata's dimensions and formats, each used tensor's byte span and
// dtype), the writer the generator uses, and reading one fp16 tensor.
// Nothing here validates a model: the library checks every descriptor
// against the file, and test/deploy/cuda.test.ts holds these descriptors
// to the TypeScript loader's, byte for byte.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

// ---- the header ----

typedef struct {
    char name[96];
    char dtype[8];
    uint64_t begin, end; /* data_offsets */
} st_entry;

#define META_KEYS 32
typedef struct {
    st_entry *t;
    int32_t n, cap;
    char keys[META_KEYS][32];
    char values[META_KEYS][256];
    int32_t n_meta;
    uint64_t data_start;
} st_header;

/* The metadata keys the descriptor needs; the others (a tokenizer's JSON, say) are skipped. */
static const char *const META_USED[] = {"dim", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "default_loops",
                                        "max_seq_len", "rope_theta", "norm_eps", "quant", "group_size",
                                        "output_quant", "output_group_size", "quant_mix", "n_layers",
                                        "norm_layout", "step_norm", "head_dim", "n_prelude", "n_coda", "injection",
                                        "embed_scale", "state_std", "mid_norm", "rope_layout", "qk_bias"};

typedef struct {
    const char *p, *end;
} json;

static void ws(json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}

static int expect(json *j, char c) {
    ws(j);
    if (j->p >= j->end || *j->p != c) return -1;
    j->p++;
    return 0;
}

/* A string into out (cap bytes, truncated; NULL: skipped); escapes other
 * than \" and \\ are kept as written (no key or value the driver reads has one). */
static int string(json *j, char *out, size_t cap) {
    if (expect(j, '"') != 0) return -1;
    size_t n = 0;
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if (c == '\\' && j->p < j->end) c = *j->p++;
        if (out && n + 1 < cap) out[n++] = c;
    }
    if (out && cap) out[n] = 0;
    return expect(j, '"');
}

static int number(json *j, double *v) {
    ws(j);
    char *e;
    *v = strtod(j->p, &e);
    if (e == j->p || e > j->end) return -1;
    j->p = e;
    return 0;
}

static int skip(json *j) {
    ws(j);
    if (j->p >= j->end) return -1;
    char c = *j->p;
    if (c == '"') return string(j, NULL, 0);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        ws(j);
        if (j->p < j->end && *j->p == close) return j->p++, 0;
        for (;;) {
            if (c == '{' && (string(j, NULL, 0) != 0 || expect(j, ':') != 0)) return -1;
            if (skip(j) != 0) return -1;
            ws(j);
            if (j->p < j->end && *j->p == ',') j->p++;
            else return expect(j, close);
        }
    }
    static const char *const literals[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(literals[k]);
        if ((size_t)(j->end - j->p) >= n && memcmp(j->p, literals[k], n) == 0) {
            j->p += n;
            return 0;
        }
    }
    double v;
    return number(j, &v);
}

static int parse_meta(json *j, st_header *h) {
    if (expect(j, '{') != 0) return -1;
    ws(j);
    if (j->p < j->end && *j->p == '}') return j->p++, 0;
    for (;;) {
        char key[32];
        if (string(j, key, sizeof key) != 0 || expect(j, ':') != 0) return -1;
        int used = 0;
        for (size_t k = 0; k < sizeof META_USED / sizeof META_USED[0]; k++) used |= strcmp(key, META_USED[k]) == 0;
        if (used && h->n_meta < META_KEYS) {
            snprintf(h->keys[h->n_meta], sizeof h->keys[0], "%s", key);
            if (string(j, h->values[h->n_meta], sizeof h->values[0]) != 0) return -1;
            h->n_meta++;
        } else if (skip(j) != 0) {
            return -1;
        }
        ws(j);
        if (j->p < j->end && *j->p == ',') j->p++;
        else return expect(j, '}');
    }
}

static int parse_tensor(json *j, st_entry *t) {
    if (expect(j, '{') != 0) return -1;
    for (;;) {
        char key[32];
        if (string(j, key, sizeof key) != 0 || expect(j, ':') != 0) return -1;
        if (strcmp(key, "dtype") == 0) {
            if (string(j, t->dtype, sizeof t->dtype) != 0) return -1;
        } else if (strcmp(key, "data_offsets") == 0) {
            double a, b;
            if (expect(j, '[') != 0 || number(j, &a) != 0 || expect(j, ',') != 0 || number(j, &b) != 0 ||
                expect(j, ']') != 0)
                return -1;
            t->begin = (uint64_t)a;
            t->end = (uint64_t)b;
        } else if (skip(j) != 0) {
            return -1;
        }
        ws(j);
        if (j->p < j->end && *j->p == ',') j->p++;
        else return expect(j, '}');
    }
}

static void header_free(st_header *h) { free(h->t); }

static int header_read(const char *path, st_header *h, char *err, size_t err_len) {
    memset(h, 0, sizeof *h);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "cannot open %s", path);
        return -1;
    }
    uint8_t len8[8];
    uint64_t len = 0;
    char *text = NULL;
    int rc = -1;
    if (fread(len8, 1, 8, f) == 8) {
        for (int i = 7; i >= 0; i--) len = (len << 8) | len8[i];
        text = len > 0 && len < (1u << 30) ? malloc(len) : NULL;
    }
    if (text && fread(text, 1, len, f) == len) {
        json j = {text, text + len};
        h->data_start = 8 + len;
        rc = expect(&j, '{');
        while (rc == 0) {
            char name[96];
            if (string(&j, name, sizeof name) != 0 || expect(&j, ':') != 0) {
                rc = -1;
                break;
            }
            if (strcmp(name, "__metadata__") == 0) {
                rc = parse_meta(&j, h);
            } else {
                if (h->n == h->cap) {
                    h->cap = h->cap ? 2 * h->cap : 64;
                    st_entry *t = realloc(h->t, (size_t)h->cap * sizeof *t);
                    if (!t) {
                        rc = -1;
                        break;
                    }
                    h->t = t;
                }
                st_entry *t = &h->t[h->n++];
                memset(t, 0, sizeof *t);
                snprintf(t->name, sizeof t->name, "%s", name);
                rc = parse_tensor(&j, t);
            }
            ws(&j);
            if (rc != 0 || j.p >= j.end || *j.p != ',') break;
            j.p++;
        }
        if (rc == 0) rc = expect(&j, '}');
    }
    free(text);
    fclose(f);
    if (rc != 0) {
        snprintf(err, err_len, "%s: not a safetensors file this driver can read", path);
        header_free(h);
    }
    return rc;
}

static const char *meta(const st_header *h, const char *key) {
    for (int32_t i = 0; i < h->n_meta; i++)
        if (strcmp(h->keys[i], key) == 0) return h->values[i];
    return NULL;
}

static const st_entry *entry(const st_header *h, const char *name) {
    for (int32_t i = 0; i < h->n; i++)
        if (strcmp(h->t[i].name, name) == 0) return &h->t[i];
    return NULL;
}

// ---- the descriptor ----

static const char *const TENSOR_NAMES[LS_TENSOR_N] = {
#define NAME_(id, name) name,
    LS_TENSORS(NAME_)
#undef NAME_
};
static const char *const LAYER_TENSOR_NAMES[LS_LAYER_TENSOR_N] = {
#define NAME_(id, name) name,
    LS_LAYER_TENSORS(NAME_)
#undef NAME_
};
static const char *const MATRICES[7] = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"};

/* The span a tensor name fills: model-wide, or a layer's (the prelude's and
 * the coda's after the core's, as d->config counts them); NULL for a name no
 * slot holds. */
static ls_tensor_span *span_of(ls_model_desc *d, const char *name) {
    for (int32_t s = 0; s < LS_TENSOR_N; s++)
        if (strcmp(name, TENSOR_NAMES[s]) == 0) return &d->tensors[s];
    static const struct {
        const char *prefix;
        int32_t numbered;
    } GROUPS[4] = {{"block.", 0}, {"layers.", 1}, {"prelude.", 1}, {"coda.", 1}};
    const int32_t first[4] = {0, 0, d->config.n_layers, d->config.n_layers + d->config.n_prelude};
    int32_t layer = -1;
    const char *rest = NULL;
    for (int g = 0; g < 4 && !rest; g++) {
        size_t n = strlen(GROUPS[g].prefix);
        if (strncmp(name, GROUPS[g].prefix, n) != 0) continue;
        int32_t i = 0;
        if (GROUPS[g].numbered && (sscanf(name + n, "%d.", &i) != 1 || i < 0)) return NULL;
        rest = GROUPS[g].numbered ? strchr(name + n, '.') + 1 : name + n;
        layer = first[g] + i;
    }
    if (!rest || layer >= LS_MAX_LAYERS) return NULL;
    for (int32_t s = 0; s < LS_LAYER_TENSOR_N; s++)
        if (strcmp(rest, LAYER_TENSOR_NAMES[s]) == 0) return &d->layers[layer].t[s];
    return NULL;
}

static int32_t int_meta(const st_header *h, const char *key, int32_t fallback) {
    const char *v = meta(h, key);
    return v ? (int32_t)strtol(v, NULL, 10) : fallback;
}

static int32_t flag_meta(const st_header *h, const char *key) { return meta(h, key) && strcmp(meta(h, key), "1") == 0; }

static int32_t bits_of(const char *quant) {
    return strcmp(quant, "int4") == 0 ? 4 : strcmp(quant, "int2") == 0 ? 2 : strcmp(quant, "int8") == 0 ? 8
           : strcmp(quant, "int6") == 0 ? 6 : 0;
}

int model_file_desc(const char *path, ls_model_desc *d, char *err, size_t err_len) {
    st_header h;
    if (header_read(path, &h, err, err_len) != 0) return -1;
    memset(d, 0, sizeof *d);
    ls_model_config *c = &d->config;
    c->dim = int_meta(&h, "dim", 0);
    c->n_heads = int_meta(&h, "n_heads", 0);
    c->n_kv_heads = int_meta(&h, "n_kv_heads", 0);
    c->ffn_dim = int_meta(&h, "ffn_dim", 0);
    c->vocab_size = int_meta(&h, "vocab_size", 0);
    c->default_loops = int_meta(&h, "default_loops", 0);
    c->max_seq_len = int_meta(&h, "max_seq_len", 0);
    /* a JavaScript number stored in an f32 field: the double, then rounded */
    c->rope_theta = meta(&h, "rope_theta") ? (float)strtod(meta(&h, "rope_theta"), NULL) : 0.0f;
    c->norm_eps = meta(&h, "norm_eps") ? (float)strtod(meta(&h, "norm_eps"), NULL) : 0.0f;
    const char *quant = meta(&h, "quant") ? meta(&h, "quant") : "fp16";
    c->quant = strcmp(quant, "int4") == 0 ? LS_QUANT_INT4 : strcmp(quant, "int2") == 0 ? LS_QUANT_INT2 : LS_QUANT_FP16;
    c->group_size = c->quant == LS_QUANT_FP16 ? 0 : int_meta(&h, "group_size", 0);
    const char *head = meta(&h, "output_quant") ? meta(&h, "output_quant") : entry(&h, "output.qweight") ? "int8" : "fp16";
    c->head_bits = bits_of(head);
    c->head_group = c->head_bits ? int_meta(&h, "output_group_size", c->group_size) : 0;
    for (int k = 0; k < 7 && c->quant != LS_QUANT_FP16; k++) {
        c->block_bits[k] = bits_of(quant);
        const char *mix = meta(&h, "quant_mix"); /* "wv=int4,wo=int4" */
        for (const char *p = mix; p && *p;) {
            char name[8], format[8];
            if (sscanf(p, " %7[a-z0-9] = %7[a-z0-9]", name, format) == 2 && strcmp(name, MATRICES[k]) == 0)
                c->block_bits[k] = bits_of(format);
            p = strchr(p, ',');
            if (p) p++;
        }
    }
    c->n_layers = int_meta(&h, "n_layers", 1);
    const char *norms = meta(&h, "norm_layout") ? meta(&h, "norm_layout") : "pre";
    c->sandwich_norm = strcmp(norms, "sandwich") == 0 ? LS_NORM_SANDWICH
                       : strcmp(norms, "sandwich_sum") == 0 ? LS_NORM_SANDWICH_SUM : LS_NORM_PRE;
    c->step_norm = flag_meta(&h, "step_norm");
    c->head_dim = int_meta(&h, "head_dim", c->n_heads > 0 ? c->dim / c->n_heads : 0);
    c->n_prelude = int_meta(&h, "n_prelude", 0);
    c->n_coda = int_meta(&h, "n_coda", 0);
    c->injection = meta(&h, "injection") && strcmp(meta(&h, "injection"), "adapter") == 0 ? LS_INJECT_ADAPTER
                                                                                            : LS_INJECT_NONE;
    c->embed_scale = meta(&h, "embed_scale") ? (float)strtod(meta(&h, "embed_scale"), NULL) : 1.0f;
    c->state_std = meta(&h, "state_std") ? (float)strtod(meta(&h, "state_std"), NULL) : 0.0f;
    c->mid_norm = flag_meta(&h, "mid_norm");
    c->rope_interleaved = meta(&h, "rope_layout") && strcmp(meta(&h, "rope_layout"), "interleaved") == 0;
    c->qk_bias = flag_meta(&h, "qk_bias");
    for (int32_t i = 0; i < h.n; i++) {
        const st_entry *t = &h.t[i];
        ls_tensor_span *s = span_of(d, t->name);
        if (!s) continue;
        s->offset = h.data_start + t->begin;
        s->length = t->end - t->begin;
        s->dtype = strcmp(t->dtype, "F16") == 0 ? LS_DTYPE_F16 : strcmp(t->dtype, "U8") == 0 ? LS_DTYPE_U8
                   : strcmp(t->dtype, "I8") == 0 ? LS_DTYPE_I8 : LS_DTYPE_NONE;
    }
    header_free(&h);
    return 0;
}

uint16_t *st_read_f16(const char *path, const char *name, int64_t *count, char *err, size_t err_len) {
    st_header h;
    if (header_read(path, &h, err, err_len) != 0) return NULL;
    const st_entry *t = entry(&h, name);
    uint16_t *out = NULL;
    if (!t || strcmp(t->dtype, "F16") != 0) {
        snprintf(err, err_len, "%s: no F16 tensor %s", path, name);
    } else {
        size_t bytes = t->end - t->begin;
        FILE *f = fopen(path, "rb");
        out = f ? malloc(bytes ? bytes : 1) : NULL;
        if (!out || fseek(f, (long)(h.data_start + t->begin), SEEK_SET) != 0 || fread(out, 1, bytes, f) != bytes) {
            snprintf(err, err_len, "%s: cannot read tensor %s", path, name);
            free(out);
            out = NULL;
        }
        if (f) fclose(f);
        *count = (int64_t)(bytes / 2);
    }
    header_free(&h);
    return out;
}

// ---- the writer ----

/* Appends to a growing buffer; -1 when out of memory. */
typedef struct {
    char *s;
    size_t n, cap;
} text;

static int add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int add(text *t, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(t->s ? t->s + t->n : NULL, t->s ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        if (w < 0) return -1;
        if (t->s && t->n + (size_t)w < t->cap) {
            t->n += (size_t)w;
            return 0;
        }
        size_t cap = (t->cap + (size_t)w + 1) * 2;
        char *s = realloc(t->s, cap);
        if (!s) return -1;
        t->s = s;
        t->cap = cap;
    }
}

static uint64_t align8(uint64_t n) { return (n + 7) / 8 * 8; }

int st_write(const char *path, const char *const *meta_kv, int32_t n_meta, const st_tensor *tensors, int32_t n,
             char *err, size_t err_len) {
    text h = {0};
    int bad = add(&h, "{\"__metadata__\":{");
    for (int32_t i = 0; i < n_meta; i++) bad |= add(&h, "%s\"%s\":\"%s\"", i ? "," : "", meta_kv[2 * i], meta_kv[2 * i + 1]);
    bad |= add(&h, "}");
    uint64_t offset = 0;
    for (int32_t i = 0; i < n; i++) {
        const st_tensor *t = &tensors[i];
        uint64_t begin = align8(offset);
        bad |= add(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", t->name, t->dtype, (long long)t->shape[0]);
        if (t->rank == 2) bad |= add(&h, ",%lld", (long long)t->shape[1]);
        bad |= add(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)begin, (unsigned long long)(begin + t->bytes));
        offset = begin + t->bytes;
    }
    bad |= add(&h, "}");
    while (!bad && h.n % 8 != 0) bad |= add(&h, " ");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = bad ? NULL : fopen(tmp, "wb");
    if (!f) {
        snprintf(err, err_len, bad ? "out of memory writing %s" : "cannot create %s", bad ? path : tmp);
        free(h.s);
        return -1;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(h.n >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(h.s, 1, h.n, f) == h.n;
    static const uint8_t zeros[8] = {0};
    offset = 0;
    for (int32_t i = 0; ok && i < n; i++) {
        uint64_t begin = align8(offset);
        ok = fwrite(zeros, 1, begin - offset, f) == begin - offset && fwrite(tensors[i].data, 1, tensors[i].bytes, f) == tensors[i].bytes;
        offset = begin + tensors[i].bytes;
    }
    ok = fclose(f) == 0 && ok;
    free(h.s);
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, err_len, "cannot write %s", path);
        remove(tmp);
        return -1;
    }
    return 0;
}
