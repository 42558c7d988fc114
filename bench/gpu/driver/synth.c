// The models the driver writes for itself: any shape, weight format and
// head, from a seed (deterministic), or a shipped fp16 model's weights
// quantized. A spec is comma-separated key=value pairs:
//   dim heads kv ffn vocab loops seq seed   the shape (seq: max_seq_len, default 2048)
//   quant=fp16|int4|int2  group=G           the block's format and group
//   mix=wv:int4+wo:int4                     block matrices in the other block format (quant_mix)
//   head=fp16|tied|int8|int6|int4 hgroup=G  the output head (default fp16; hgroup default group)
//   embed=0                                 no tok_embeddings: the quantized head's rows serve
//   layers=N sandwich=1 stepnorm=1 gate=1   a stack (format version 2; sandwich=2: the summed sandwich
//                                           norms, LS_NORM_SANDWICH_SUM); the gate's bias ~N(-1, 0.5), or
//                                           gatebias=B exactly
//   theta=T eps=E                           rope_theta (10000) and norm_eps (1e-05)
//   prelude=P coda=C inject=1               recurrent depth (docs/model-format.md): P layers before the
//                                           stack, C after it, each step's input through adapter.weight
//                                           (only to be refused by the CUDA library, or run by the CPU one)
//   from=FILE                               the shape and fp16 weights of a model file (a single block or
//                                           a stack), quantized to quant/head (round to nearest, per group)
//   ouro=1                                  with from=: the model as the Ouro import writes it from an Ouro
//                                           checkpoint of those weights: as many key/value heads as query
//                                           heads (each kv head's rows repeated for the query heads that
//                                           shared it: the same function), an untied head
// Weight scales follow src/model/synthetic.ts: embeddings ~N(0, 1), the head
// ~3 / sqrt(dim), projections ~1 / sqrt(fan_in), norms near 1; quantized
// matrices draw their codes uniformly with group scales of either sign (int2:
// offsets centring the codes) that give the same spread.
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

// ---- fp16 ----

uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
    if (mag >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0));
    if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past the largest fp16 */
    if (mag < 0x38800000u) {                                      /* subnormal or zero: in units of 2^-24 */
        float a;
        memcpy(&a, &mag, 4);
        return (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f));
    }
    uint32_t r = mag + 0xfffu + ((mag >> 13) & 1u); /* round to nearest even at bit 13 */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0) {
        float f = (float)mant * 5.9604644775390625e-8f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// ---- the spec ----

typedef struct {
    int32_t dim, heads, kv, ffn, vocab, loops, seq, seed;
    int32_t quant_bits, group;    /* 0 = fp16 */
    int32_t mix[7];               /* per matrix: 0 = the block's format, else its bits */
    int32_t head_bits, hgroup;    /* 0 = fp16 */
    int32_t tied, embed;          /* tied fp16 head; embed 0 = no tok_embeddings */
    int32_t layers, sandwich, stepnorm, gate, ouro;
    int32_t prelude, coda, inject; /* recurrent depth */
    double gate_bias, gate_bias_sd, theta, eps;
    char from[1024];
} spec;

static const char *const MATS[7] = {"wq", "wk", "wv", "wo", "w1", "w2", "w3"};

static int32_t format_bits(const char *v) {
    return strncmp(v, "int8", 4) == 0 ? 8 : strncmp(v, "int6", 4) == 0 ? 6 : strncmp(v, "int4", 4) == 0 ? 4
           : strncmp(v, "int2", 4) == 0 ? 2 : 0;
}

/* The spec's whole-number keys, each named as the field it sets. */
static const struct {
    const char *key;
    size_t offset;
} INT_SETTINGS[] = {
#define INT_(field) {#field, offsetof(spec, field)},
    INT_(dim) INT_(heads) INT_(kv) INT_(ffn) INT_(vocab) INT_(loops) INT_(seq) INT_(seed) INT_(group) INT_(hgroup)
    INT_(embed) INT_(layers) INT_(sandwich) INT_(stepnorm) INT_(gate) INT_(ouro) INT_(prelude) INT_(coda) INT_(inject)
#undef INT_
};

/* The field a whole-number key sets; NULL for any other key. */
static int32_t *int_setting(spec *s, const char *key) {
    for (size_t i = 0; i < sizeof INT_SETTINGS / sizeof INT_SETTINGS[0]; i++)
        if (strcmp(key, INT_SETTINGS[i].key) == 0) return (int32_t *)((char *)s + INT_SETTINGS[i].offset);
    return NULL;
}

static int parse_spec(const char *text, spec *s, char *err, size_t err_len) {
    memset(s, 0, sizeof *s);
    s->heads = 4;
    s->kv = 2;
    s->loops = 4;
    s->seq = 2048;
    s->seed = 1;
    s->embed = 1;
    s->layers = 1;
    s->gate_bias = -1.0;
    s->gate_bias_sd = 0.5;
    s->theta = 10000.0;
    s->eps = 1e-5;
    char buf[2048];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            snprintf(err, err_len, "model spec entry \"%s\" is not key=value", kv);
            return -1;
        }
        *eq = 0;
        const char *k = kv, *v = eq + 1;
        int32_t *whole = int_setting(s, k);
        if (whole) *whole = (int32_t)strtol(v, NULL, 10);
        else if (strcmp(k, "quant") == 0) s->quant_bits = format_bits(v);
        else if (strcmp(k, "gatebias") == 0) {
            s->gate_bias = strtod(v, NULL);
            s->gate_bias_sd = 0.0;
        }
        else if (strcmp(k, "theta") == 0) s->theta = strtod(v, NULL);
        else if (strcmp(k, "eps") == 0) s->eps = strtod(v, NULL);
        else if (strcmp(k, "from") == 0) snprintf(s->from, sizeof s->from, "%s", v);
        else if (strcmp(k, "head") == 0) {
            s->tied = strcmp(v, "tied") == 0;
            s->head_bits = format_bits(v);
        } else if (strcmp(k, "mix") == 0) {
            for (const char *p = v; *p;) { /* wv:int4+wo:int4 */
                for (int m = 0; m < 7; m++)
                    if (strncmp(p, MATS[m], 2) == 0 && p[2] == ':') s->mix[m] = format_bits(p + 3);
                p = strchr(p, '+');
                p = p ? p + 1 : "";
            }
        } else {
            snprintf(err, err_len, "model spec: unknown key \"%s\"", k);
            return -1;
        }
    }
    if (s->hgroup == 0) s->hgroup = s->group ? s->group : 32;
    return 0;
}

// ---- weights ----

typedef struct {
    uint64_t s;
} rng;

static uint64_t next(rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform(rng *r) { return (double)(next(r) >> 11) * 0x1.0p-53; }
/* ~N(0, 1): an Irwin-Hall sum of four uniforms, scaled. */
static double normal(rng *r) { return (uniform(r) + uniform(r) + uniform(r) + uniform(r) - 2.0) * 1.7320508075688772; }

static rng stream(int32_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(uint32_t)seed;
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return (rng){h};
}

/* Stores code c (signed for int8/6/4, 0..3 for int2) of input i of a row (loopserve.h's packing). */
static void put_code(uint8_t *row, int32_t in, int32_t i, int32_t bits, int32_t c) {
    switch (bits) {
    case 8: row[i] = (uint8_t)(int8_t)c; return;
    case 4: row[i >> 1] |= (uint8_t)((c + 8) << (4 * (i & 1))); return;
    case 2: row[i >> 2] |= (uint8_t)(c << (2 * (i & 3))); return;
    default: {
        int32_t u = c + 32, j = (i & 63) >> 1;
        row[i >> 1] |= (uint8_t)((u & 15) << (4 * (i & 1)));
        row[in / 2 + 16 * (i >> 6) + (j & 15)] |= (uint8_t)((u >> 4) << (4 * (j >> 4) + 2 * (i & 1)));
        return;
    }
    }
}

static int32_t code_lo(int32_t bits) { return bits == 2 ? 0 : -(1 << (bits - 1)) + (bits == 8); }
static int32_t code_hi(int32_t bits) { return bits == 2 ? 3 : (1 << (bits - 1)) - 1; }

/* A list of tensors being built, and the memory behind them. */
typedef struct {
    st_tensor t[8 + 11 * LS_MAX_LAYERS];
    int32_t n;
    int failed;
} tensors;

static void *tensor(tensors *ts, const char *name, const char *dtype, int64_t rows, int64_t cols, size_t elem) {
    st_tensor *t = &ts->t[ts->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->rank = cols > 0 ? 2 : 1;
    t->bytes = (size_t)rows * (size_t)(cols > 0 ? cols : 1) * elem;
    t->data = calloc(t->bytes ? t->bytes : 1, 1);
    if (!t->data) ts->failed = 1;
    else ts->n++;
    return t->data;
}

static void fp16_tensor(tensors *ts, const char *name, int64_t rows, int64_t cols, const uint16_t *from, double mean,
                        double sd, rng *r) {
    uint16_t *d = tensor(ts, name, "F16", rows, cols, 2);
    for (int64_t i = 0; d && i < rows * (cols > 0 ? cols : 1); i++)
        d[i] = from ? from[i] : f32_to_f16((float)(mean + sd * normal(r)));
}

/* Matrix `name` (out x in) quantized to bits in groups of G: random codes
 * with group scales giving spread sd, or (from) the fp16 weights rounded
 * to the nearest code. head: stored under output.*. */
static void quant_tensor(tensors *ts, const char *prefix, int64_t out, int32_t in, int32_t bits, int32_t G,
                         const uint16_t *from, double sd, rng *r) {
    char name[96];
    const int32_t ng = in / G, lo = code_lo(bits), hi = code_hi(bits);
    snprintf(name, sizeof name, "%s.qweight", prefix);
    uint8_t *q = tensor(ts, name, bits == 8 ? "I8" : "U8", out, (int64_t)in * bits / 8, 1);
    snprintf(name, sizeof name, "%s.scales", prefix);
    uint16_t *sc = tensor(ts, name, "F16", out, ng, 2), *zr = NULL;
    if (bits == 2) {
        snprintf(name, sizeof name, "%s.zeros", prefix);
        zr = tensor(ts, name, "F16", out, ng, 2);
    }
    if (!q || !sc || (bits == 2 && !zr)) return;
    /* the spread of a uniform code: sqrt(((hi - lo + 1)^2 - 1) / 12) */
    const double code_sd = sqrt(((double)(hi - lo + 1) * (hi - lo + 1) - 1) / 12.0);
    for (int64_t o = 0; o < out; o++) {
        uint8_t *row = q + o * ((int64_t)in * bits / 8);
        for (int32_t g = 0; g < ng; g++) {
            float s, z = 0.0f;
            const uint16_t *w = from ? from + o * in + (int64_t)g * G : NULL;
            if (w) { /* round to nearest: symmetric around 0, or (int2) from the group's minimum */
                float mn = INFINITY, mx = -INFINITY, amax = 0.0f;
                for (int32_t i = 0; i < G; i++) {
                    float v = f16_to_f32(w[i]);
                    mn = fminf(mn, v);
                    mx = fmaxf(mx, v);
                    amax = fmaxf(amax, fabsf(v));
                }
                s = bits == 2 ? (mx - mn) / 3.0f : amax / (float)hi;
                z = bits == 2 ? mn : 0.0f;
                if (!(s > 0.0f)) s = 1.0f;
            } else {
                s = (float)(sd / code_sd * (0.8 + 0.4 * uniform(r)) * (next(r) & 1 ? -1 : 1));
                z = (float)(-0.5 * (lo + hi)) * s;
            }
            sc[o * ng + g] = f32_to_f16(s);
            s = f16_to_f32(sc[o * ng + g]);
            if (zr) {
                zr[o * ng + g] = f32_to_f16(z);
                z = f16_to_f32(zr[o * ng + g]);
            }
            for (int32_t i = 0; i < G; i++) {
                int32_t c = w ? (int32_t)nearbyintf((f16_to_f32(w[i]) - z) / s) : lo + (int32_t)(next(r) % (uint64_t)(hi - lo + 1));
                c = c < lo ? lo : c > hi ? hi : c;
                put_code(row, in, g * G + i, bits, c);
            }
        }
    }
}

/* rows (out / group, in) of heads of hd rows each, every head repeated
 * `group` times in place: (out, in). */
static uint16_t *repeat_heads(uint16_t *rows, int64_t out, int32_t in, int32_t hd, int32_t group) {
    uint16_t *w = malloc((size_t)out * (size_t)in * sizeof *w);
    const size_t head = (size_t)hd * (size_t)in;
    for (int64_t h = 0; w && h < out / hd; h++) memcpy(w + (size_t)h * head, rows + (size_t)(h / group) * head, head * sizeof *w);
    free(rows);
    return w;
}

/* A block matrix: fp16 or quantized, fresh or from the source file (wk and
 * wv of src_kv heads repeated to s->kv). */
static void matrix(tensors *ts, const spec *s, const char *layer, int m, int64_t out, int32_t in, const char *src,
                   int32_t src_kv, char *err, size_t err_len) {
    char prefix[80], name[96];
    snprintf(prefix, sizeof prefix, "%s%s", layer, MATS[m]);
    snprintf(name, sizeof name, "%s.weight", prefix);
    rng r = stream(s->seed, prefix);
    uint16_t *from = NULL;
    if (src) {
        const int kv = m == 1 || m == 2, group = kv ? s->kv / src_kv : 1;
        int64_t count;
        from = st_read_f16(src, name, &count, err, err_len);
        if (from && group > 1) from = repeat_heads(from, out, in, s->dim / s->heads, group);
        if (!from || count * group != out * in) {
            ts->failed = 1;
            free(from);
            return;
        }
    }
    int32_t bits = s->mix[m] ? s->mix[m] : s->quant_bits;
    double sd = 1.0 / sqrt((double)in);
    if (bits) quant_tensor(ts, prefix, out, in, bits, s->group, from, sd, &r);
    else fp16_tensor(ts, name, out, in, from, 0.0, sd, &r);
    free(from);
}

int synth_write(const char *spec_text, const char *path, char *err, size_t err_len) {
    spec s;
    if (parse_spec(spec_text, &s, err, err_len) != 0) return -1;
    const char *src = s.from[0] ? s.from : NULL;
    int32_t src_kv = 0, src_tied = 0;
    if (src && (s.prelude || s.coda || s.inject)) {
        snprintf(err, err_len, "model spec \"%s\": from= takes no recurrent depth", spec_text);
        return -1;
    }
    if (src) {
        ls_model_desc d;
        if (model_file_desc(src, &d, err, err_len) != 0) return -1;
        const ls_model_config *c = &d.config;
        if (c->quant != LS_QUANT_FP16 || c->head_bits) {
            snprintf(err, err_len, "%s: from= takes an fp16 model", src);
            return -1;
        }
        s.dim = c->dim;
        s.heads = c->n_heads;
        s.kv = src_kv = c->n_kv_heads;
        s.ffn = c->ffn_dim;
        s.vocab = c->vocab_size;
        s.loops = c->default_loops;
        s.seq = c->max_seq_len;
        s.theta = c->rope_theta;
        s.eps = c->norm_eps;
        s.layers = c->n_layers;
        s.sandwich = c->sandwich_norm;
        s.stepnorm = c->step_norm;
        s.gate = d.tensors[LS_TENSOR_EXIT_GATE_WEIGHT].dtype != LS_DTYPE_NONE;
        s.tied = src_tied = d.tensors[LS_TENSOR_OUTPUT_WEIGHT].dtype == LS_DTYPE_NONE;
        if (s.ouro) { /* the Ouro layout: a key/value head per query head, an untied head */
            s.kv = s.heads;
            s.tied = 0;
        }
    }
    if (s.dim <= 0 || s.ffn <= 0 || s.vocab <= 0 || s.heads <= 0 || s.kv <= 0) {
        snprintf(err, err_len, "model spec \"%s\" lacks a shape (dim, heads, kv, ffn, vocab)", spec_text);
        return -1;
    }
    tensors *ts = calloc(1, sizeof *ts);
    if (!ts) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    err[0] = 0;
    const int64_t dim = s.dim, kv_dim = (int64_t)s.kv * (s.dim / s.heads), ffn = s.ffn, vocab = s.vocab;
    rng r = stream(s.seed, "tok_embeddings.weight");
    uint16_t *emb = NULL;
    int64_t count = 0;
    if (src) emb = st_read_f16(src, "tok_embeddings.weight", &count, err, err_len);
    if (s.embed) fp16_tensor(ts, "tok_embeddings.weight", vocab, dim, emb, 0.0, 1.0, &r);
    /* the core's layers, then the prelude's and the coda's */
    for (int32_t l = 0; l < s.layers + s.prelude + s.coda && !ts->failed; l++) {
        char layer[32], name[96];
        if (l >= s.layers + s.prelude) snprintf(layer, sizeof layer, "coda.%d.", l - s.layers - s.prelude);
        else if (l >= s.layers) snprintf(layer, sizeof layer, "prelude.%d.", l - s.layers);
        else if (s.layers == 1) snprintf(layer, sizeof layer, "block.");
        else snprintf(layer, sizeof layer, "layers.%d.", l);
        const char *norms[4] = {"attn_norm", "ffn_norm", "attn_out_norm", "ffn_out_norm"};
        for (int k = 0; k < (s.sandwich ? 4 : 2); k++) {
            snprintf(name, sizeof name, "%s%s.weight", layer, norms[k]);
            rng nr = stream(s.seed, name);
            uint16_t *from = src ? st_read_f16(src, name, &count, err, err_len) : NULL;
            fp16_tensor(ts, name, dim, 0, from, 1.0, 0.05, &nr);
            free(from);
        }
        const int64_t outs[7] = {dim, kv_dim, kv_dim, dim, ffn, dim, ffn};
        const int32_t ins[7] = {(int32_t)dim, (int32_t)dim, (int32_t)dim, (int32_t)dim, (int32_t)dim, (int32_t)ffn, (int32_t)dim};
        for (int m = 0; m < 7 && !ts->failed; m++) matrix(ts, &s, layer, m, outs[m], ins[m], src, src_kv, err, err_len);
    }
    if (s.inject) {
        rng ar = stream(s.seed, "adapter.weight");
        fp16_tensor(ts, "adapter.weight", dim, 2 * dim, NULL, 0.0, 1.0 / sqrt(2.0 * (double)dim), &ar);
    }
    rng nr = stream(s.seed, "norm.weight");
    uint16_t *norm = src ? st_read_f16(src, "norm.weight", &count, err, err_len) : NULL;
    fp16_tensor(ts, "norm.weight", dim, 0, norm, 1.0, 0.05, &nr);
    free(norm);
    rng hr = stream(s.seed, "output.weight");
    uint16_t *head = NULL;
    if (src) head = src_tied ? emb : st_read_f16(src, "output.weight", &count, err, err_len);
    if (s.head_bits) quant_tensor(ts, "output", vocab, (int32_t)dim, s.head_bits, s.hgroup, head, 3.0 / sqrt((double)dim), &hr);
    else if (!s.tied) fp16_tensor(ts, "output.weight", vocab, dim, head, 0.0, 3.0 / sqrt((double)dim), &hr);
    if (head != emb) free(head);
    free(emb);
    if (s.gate) {
        rng gr = stream(s.seed, "exit_gate.weight");
        const char *names[2] = {"exit_gate.weight", "exit_gate.bias"};
        for (int k = 0; k < 2; k++) {
            uint16_t *from = src ? st_read_f16(src, names[k], &count, err, err_len) : NULL;
            fp16_tensor(ts, names[k], 1, k == 0 ? dim : 0, from, k == 0 ? 0.0 : s.gate_bias,
                        k == 0 ? 1.0 / sqrt((double)dim) : s.gate_bias_sd, &gr);
            free(from);
        }
    }
    int rc = -1;
    if (!ts->failed) {
        char v[16][32], mix[64] = "", theta[32], eps[32], prelude[16], coda[16];
        snprintf(theta, sizeof theta, "%.9g", s.theta);
        snprintf(eps, sizeof eps, "%.9g", s.eps);
        for (int m = 0; m < 7; m++)
            if (s.mix[m] && s.mix[m] != s.quant_bits)
                snprintf(mix + strlen(mix), sizeof mix - strlen(mix), "%s%s=int%d", mix[0] ? "," : "", MATS[m], s.mix[m]);
        int version = s.layers != 1 || s.sandwich || s.stepnorm || s.gate || s.prelude || s.coda || s.inject ? 2 : 1;
        const char *quant = s.quant_bits == 4 ? "int4" : s.quant_bits == 2 ? "int2" : "fp16";
        int32_t ints[] = {version, s.dim, s.heads, s.kv, s.ffn, s.vocab, s.loops, s.seq, s.quant_bits ? s.group : 0,
                          s.head_bits, s.hgroup, s.layers};
        for (int i = 0; i < 12; i++) snprintf(v[i], sizeof v[i], "%d", ints[i]);
        const char *meta[64] = {"format", "loopserve", "format_version", v[0], "arch", "looped-llama", "tokenizer", "gpt2",
                                "dim", v[1], "n_heads", v[2], "n_kv_heads", v[3], "ffn_dim", v[4], "vocab_size", v[5],
                                "default_loops", v[6], "max_seq_len", v[7], "rope_theta", theta, "norm_eps", eps,
                                "quant", quant, "group_size", v[8]};
        int32_t n_meta = 15;
        char head_name[8];
        snprintf(head_name, sizeof head_name, "int%d", s.head_bits);
        if (s.head_bits) {
            meta[2 * n_meta] = "output_quant", meta[2 * n_meta + 1] = head_name, n_meta++;
            meta[2 * n_meta] = "output_group_size", meta[2 * n_meta + 1] = v[10], n_meta++;
        }
        if (mix[0]) meta[2 * n_meta] = "quant_mix", meta[2 * n_meta + 1] = mix, n_meta++;
        if (s.layers != 1) meta[2 * n_meta] = "n_layers", meta[2 * n_meta + 1] = v[11], n_meta++;
        if (s.sandwich) meta[2 * n_meta] = "norm_layout", meta[2 * n_meta + 1] = s.sandwich == 2 ? "sandwich_sum" : "sandwich", n_meta++;
        if (s.stepnorm) meta[2 * n_meta] = "step_norm", meta[2 * n_meta + 1] = "1", n_meta++;
        if (s.ouro) meta[2 * n_meta] = "source_arch", meta[2 * n_meta + 1] = "ouro", n_meta++;
        snprintf(prelude, sizeof prelude, "%d", s.prelude);
        snprintf(coda, sizeof coda, "%d", s.coda);
        if (s.prelude) meta[2 * n_meta] = "n_prelude", meta[2 * n_meta + 1] = prelude, n_meta++;
        if (s.coda) meta[2 * n_meta] = "n_coda", meta[2 * n_meta + 1] = coda, n_meta++;
        if (s.inject) meta[2 * n_meta] = "injection", meta[2 * n_meta + 1] = "adapter", n_meta++;
        if (s.inject) meta[2 * n_meta] = "state_std", meta[2 * n_meta + 1] = "0.5", n_meta++;
        rc = st_write(path, meta, n_meta, ts->t, ts->n, err, err_len);
    } else if (!err[0]) {
        snprintf(err, err_len, "out of memory generating %s", spec_text);
    }
    for (int32_t i = 0; i < ts->n; i++) free(ts->t[i].data);
    free(ts);
    return rc;
}
