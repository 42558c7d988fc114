/*
 * json.c — strict JSON parser for the safetensors header. See json.h.
 *
 * Recursive descent over a length-bounded buffer. Memory is bounded by the
 * input: decoded strings never exceed their encoded form, so one buffer of
 * len + 1 bytes holds them all, and the node array is capped.
 */
#include "json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

typedef struct {
    const unsigned char *s;
    size_t len;
    size_t pos;
    ls_json_doc *doc;
    uint32_t cap;      /* nodes allocated */
    size_t str_used;   /* bytes of doc->strings in use */
    size_t str_cap;
    char *err;
    int32_t err_len;
    int failed;
} parser;

// ---- errors ----

static void fail(parser *p, size_t at, const char *what) {
    if (p->failed) return;
    p->failed = 1;
    ls_set_error(p->err, p->err_len, "%s at byte %zu", what, at);
}

static void fail_char(parser *p, const char *expected) {
    if (p->failed) return;
    if (p->pos >= p->len) {
        p->failed = 1;
        ls_set_error(p->err, p->err_len, "unexpected end of input, expected %s at byte %zu",
                     expected, p->pos);
        return;
    }
    unsigned char c = p->s[p->pos];
    p->failed = 1;
    if (c >= 0x20 && c < 0x7f)
        ls_set_error(p->err, p->err_len, "expected %s, found '%c' at byte %zu", expected, c, p->pos);
    else
        ls_set_error(p->err, p->err_len, "expected %s, found byte 0x%02x at byte %zu", expected, c,
                     p->pos);
}

// ---- nodes ----

static uint32_t new_node(parser *p, ls_json_type type) {
    ls_json_doc *d = p->doc;
    if (d->n_nodes >= p->cap) {
        if (p->cap >= LS_JSON_MAX_NODES) {
            fail(p, p->pos, "too many JSON values (limit 1048576)");
            return LS_JSON_NONE;
        }
        uint32_t cap = p->cap ? p->cap * 2 : 64;
        if (cap > LS_JSON_MAX_NODES) cap = LS_JSON_MAX_NODES;
        ls_json_node *n = realloc(d->nodes, (size_t)cap * sizeof *n);
        if (!n) {
            fail(p, p->pos, "out of memory parsing JSON");
            return LS_JSON_NONE;
        }
        d->nodes = n;
        p->cap = cap;
    }
    uint32_t i = d->n_nodes++;
    ls_json_node *n = &d->nodes[i];
    memset(n, 0, sizeof *n);
    n->type = type;
    n->offset = p->pos;
    n->next = i + 1;
    return i;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

// ---- numbers ----

// Exact powers of ten: a double holds 10^k exactly up to k = 22, so one
// multiply or divide of an exact integer mantissa is correctly rounded.
static const double pow10_exact[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                       1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                       1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

// Scans a number starting at s[*pos]; on success advances *pos past it.
// Strict: the JSON grammar. Lenient: also a leading '+', leading zeros, "5."
// and ".5" (the metadata grammar the TypeScript loader accepts).
// Locale-independent on purpose: strtod would read "1.5" differently under a
// locale whose decimal point is ','.
static int scan_number(const unsigned char *s, size_t len, size_t *pos, int lenient, int *is_int,
                       int64_t *iv, double *dv) {
    size_t i = *pos;
    int neg = 0;
    if (i < len && (s[i] == '-' || (lenient && s[i] == '+'))) {
        neg = s[i] == '-';
        i++;
    }
    uint64_t mant = 0;  // first 19 significant digits
    int n_sig = 0;      // significant digits kept in mant
    long dropped = 0;   // integer-part digits beyond the 19 kept
    long frac_kept = 0; // fraction digits folded into mant
    int int_ok = 1;     // integer value still fits uint64 exactly
    uint64_t ival = 0;
    size_t int_digits = 0, frac_digits = 0;

    if (!lenient && (i >= len || s[i] < '0' || s[i] > '9')) return -1;
    if (!lenient && s[i] == '0' && i + 1 < len && s[i + 1] >= '0' && s[i + 1] <= '9')
        return -1; // JSON forbids leading zeros
    while (i < len && s[i] >= '0' && s[i] <= '9') {
        unsigned dgt = (unsigned)(s[i] - '0');
        if (n_sig < 19) {
            if (mant != 0 || dgt != 0) {
                mant = mant * 10 + dgt;
                n_sig++;
            }
        } else {
            dropped++;
        }
        if (int_ok) {
            if (ival > (UINT64_MAX - dgt) / 10) int_ok = 0;
            else ival = ival * 10 + dgt;
        }
        int_digits++;
        i++;
    }
    int has_frac = 0, has_exp = 0;
    if (i < len && s[i] == '.') {
        has_frac = 1;
        i++;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            unsigned dgt = (unsigned)(s[i] - '0');
            if (n_sig < 19) {
                if (mant != 0 || dgt != 0) {
                    mant = mant * 10 + dgt;
                    n_sig++;
                }
                frac_kept++;
            }
            frac_digits++;
            i++;
        }
        if (frac_digits == 0 && (!lenient || int_digits == 0)) return -1;
    }
    if (int_digits == 0 && frac_digits == 0) return -1;
    long e10 = 0;
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        has_exp = 1;
        i++;
        int eneg = 0;
        if (i < len && (s[i] == '+' || s[i] == '-')) {
            eneg = s[i] == '-';
            i++;
        }
        if (i >= len || s[i] < '0' || s[i] > '9') return -1;
        while (i < len && s[i] >= '0' && s[i] <= '9') {
            if (e10 < 100000) e10 = e10 * 10 + (s[i] - '0'); // saturate: far beyond double range
            i++;
        }
        if (eneg) e10 = -e10;
    }
    *pos = i;

    e10 += dropped - frac_kept;
    double d;
    if (mant == 0) {
        d = 0.0;
    } else if (mant <= (1ull << 53) && e10 >= -22 && e10 <= 22) {
        d = e10 >= 0 ? (double)mant * pow10_exact[e10] : (double)mant / pow10_exact[-e10];
    } else if (e10 + n_sig > 320) {
        d = (double)INFINITY;
    } else if (e10 + n_sig < -345) {
        d = 0.0;
    } else {
        // Extended precision keeps the error within an ulp or two of the double.
        long double r = (long double)mant, base = 10.0L, scale = 1.0L;
        unsigned long k = (unsigned long)(e10 < 0 ? -e10 : e10);
        while (k) {
            if (k & 1) scale *= base;
            base *= base;
            k >>= 1;
        }
        r = e10 < 0 ? r / scale : r * scale;
        d = (double)r;
    }
    *dv = neg ? -d : d;

    *is_int = 0;
    *iv = 0;
    if (!has_frac && !has_exp && int_ok) {
        if (!neg && ival <= (uint64_t)INT64_MAX) {
            *is_int = 1;
            *iv = (int64_t)ival;
        } else if (neg && ival <= (uint64_t)INT64_MAX + 1u) {
            *is_int = 1;
            *iv = ival == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)ival;
        }
    }
    return 0;
}

static int parse_whole(const char *text, size_t len, int lenient, double *out) {
    if (text == NULL || out == NULL) return -1;
    size_t pos = 0;
    int is_int;
    int64_t iv;
    double d;
    if (scan_number((const unsigned char *)text, len, &pos, lenient, &is_int, &iv, &d) != 0)
        return -1;
    if (pos != len) return -1;
    *out = d;
    return 0;
}

int ls_json_parse_number(const char *text, size_t len, double *out) {
    return parse_whole(text, len, 0, out);
}

int ls_parse_decimal(const char *text, size_t len, double *out) {
    return parse_whole(text, len, 1, out);
}

// ---- strings ----

static int hex4(const unsigned char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char c = s[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

// Length of the valid UTF-8 sequence at s[0..avail), or 0 if invalid
// (overlong forms, surrogates and code points above U+10FFFF are invalid).
static size_t utf8_len(const unsigned char *s, size_t avail) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) n = 2;
    else if (c == 0xe0) { n = 3; lo = 0xa0; }
    else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) n = 3;
    else if (c == 0xed) { n = 3; hi = 0x9f; }
    else if (c == 0xf0) { n = 4; lo = 0x90; }
    else if (c >= 0xf1 && c <= 0xf3) n = 4;
    else if (c == 0xf4) { n = 4; hi = 0x8f; }
    else return 0;
    if (avail < n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < n; k++)
        if (s[k] < 0x80 || s[k] > 0xbf) return 0;
    return n;
}

static size_t put_utf8(char *dst, uint32_t cp) {
    if (cp < 0x80) {
        dst[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        dst[0] = (char)(0xc0 | (cp >> 6));
        dst[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        dst[0] = (char)(0xe0 | (cp >> 12));
        dst[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        dst[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    dst[0] = (char)(0xf0 | (cp >> 18));
    dst[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    dst[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    dst[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

// Encoded bytes (quotes included) bound the decoded bytes plus the NUL, so
// all strings together fit in len + 1; this check guards that reasoning.
static int room(parser *p, size_t n, size_t k) {
    if (p->str_used + n + k + 1 <= p->str_cap) return 1;
    fail(p, p->pos, "internal error: string buffer exhausted");
    return 0;
}

static uint32_t parse_string(parser *p) {
    uint32_t idx = new_node(p, LS_JSON_STRING);
    if (idx == LS_JSON_NONE) return idx;
    p->pos++; // opening quote, checked by the caller
    char *out = p->doc->strings + p->str_used;
    size_t n = 0;
    for (;;) {
        if (p->pos >= p->len) {
            fail(p, p->pos, "unterminated string");
            return LS_JSON_NONE;
        }
        unsigned char c = p->s[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) {
            fail(p, p->pos, "unescaped control character in string");
            return LS_JSON_NONE;
        }
        if (c != '\\') {
            size_t k = utf8_len(p->s + p->pos, p->len - p->pos);
            if (k == 0) {
                fail(p, p->pos, "invalid UTF-8 in string");
                return LS_JSON_NONE;
            }
            if (!room(p, n, k)) return LS_JSON_NONE;
            memcpy(out + n, p->s + p->pos, k);
            n += k;
            p->pos += k;
            continue;
        }
        size_t esc_at = p->pos;
        if (p->pos + 1 >= p->len) {
            fail(p, p->pos, "unterminated escape in string");
            return LS_JSON_NONE;
        }
        unsigned char e = p->s[p->pos + 1];
        p->pos += 2;
        char tmp[4];
        size_t k = 1;
        switch (e) {
        case '"': tmp[0] = '"'; break;
        case '\\': tmp[0] = '\\'; break;
        case '/': tmp[0] = '/'; break;
        case 'b': tmp[0] = '\b'; break;
        case 'f': tmp[0] = '\f'; break;
        case 'n': tmp[0] = '\n'; break;
        case 'r': tmp[0] = '\r'; break;
        case 't': tmp[0] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (p->len - p->pos < 4 || hex4(p->s + p->pos, &cp) != 0) {
                fail(p, esc_at, "invalid \\u escape in string");
                return LS_JSON_NONE;
            }
            p->pos += 4;
            if (cp >= 0xdc00 && cp <= 0xdfff) {
                fail(p, esc_at, "unpaired low surrogate in string");
                return LS_JSON_NONE;
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                uint32_t lo;
                if (p->len - p->pos < 6 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
                    hex4(p->s + p->pos + 2, &lo) != 0 || lo < 0xdc00 || lo > 0xdfff) {
                    fail(p, esc_at, "unpaired high surrogate in string");
                    return LS_JSON_NONE;
                }
                p->pos += 6;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            k = put_utf8(tmp, cp);
            break;
        }
        default:
            fail(p, esc_at, "invalid escape in string");
            return LS_JSON_NONE;
        }
        if (!room(p, n, k)) return LS_JSON_NONE;
        memcpy(out + n, tmp, k);
        n += k;
    }
    out[n] = '\0';
    if (n > UINT32_MAX) {
        fail(p, p->doc->nodes[idx].offset, "string too long");
        return LS_JSON_NONE;
    }
    ls_json_node *node = &p->doc->nodes[idx];
    node->str = out;
    node->len = (uint32_t)n;
    p->str_used += n + 1;
    return idx;
}

// ---- containers ----

typedef struct {
    const char *s;
    uint32_t len;
    size_t offset;
} key_ref;

static int key_cmp(const void *a, const void *b) {
    const key_ref *x = a, *y = b;
    uint32_t m = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, m);
    if (c != 0) return c;
    return (x->len > y->len) - (x->len < y->len);
}

static void fail_duplicate(parser *p, const key_ref *k) {
    char shown[65];
    size_t m = k->len < 64 ? k->len : 64;
    for (size_t i = 0; i < m; i++) {
        unsigned char c = (unsigned char)k->s[i];
        shown[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    shown[m] = '\0';
    if (p->failed) return;
    p->failed = 1;
    ls_set_error(p->err, p->err_len, "duplicate key '%s%s' at byte %zu", shown,
                 k->len > 64 ? "..." : "", k->offset);
}

static int check_duplicates(parser *p, uint32_t obj) {
    uint32_t count = p->doc->nodes[obj].count;
    if (count < 2) return 0;
    key_ref *keys = malloc((size_t)count * sizeof *keys);
    if (!keys) {
        fail(p, p->doc->nodes[obj].offset, "out of memory parsing JSON");
        return -1;
    }
    uint32_t k = obj + 1;
    for (uint32_t i = 0; i < count; i++) {
        const ls_json_node *key = &p->doc->nodes[k];
        keys[i] = (key_ref){key->str, key->len, key->offset};
        k = p->doc->nodes[k + 1].next;
    }
    qsort(keys, count, sizeof *keys, key_cmp);
    int rc = 0;
    for (uint32_t i = 1; i < count; i++) {
        if (key_cmp(&keys[i - 1], &keys[i]) == 0) {
            // Report the later occurrence: that is where the reader notices.
            fail_duplicate(p, keys[i - 1].offset > keys[i].offset ? &keys[i - 1] : &keys[i]);
            rc = -1;
            break;
        }
    }
    free(keys);
    return rc;
}

static uint32_t parse_value(parser *p, int depth);

static uint32_t parse_array(parser *p, int depth) {
    uint32_t idx = new_node(p, LS_JSON_ARRAY);
    if (idx == LS_JSON_NONE) return idx;
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ']') {
        p->pos++;
        p->doc->nodes[idx].next = p->doc->n_nodes;
        return idx;
    }
    uint32_t count = 0;
    for (;;) {
        skip_ws(p);
        if (parse_value(p, depth + 1) == LS_JSON_NONE) return LS_JSON_NONE;
        count++;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == ']') {
            p->pos++;
            break;
        }
        fail_char(p, "',' or ']' in array");
        return LS_JSON_NONE;
    }
    p->doc->nodes[idx].count = count;
    p->doc->nodes[idx].next = p->doc->n_nodes;
    return idx;
}

static uint32_t parse_object(parser *p, int depth) {
    uint32_t idx = new_node(p, LS_JSON_OBJECT);
    if (idx == LS_JSON_NONE) return idx;
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == '}') {
        p->pos++;
        p->doc->nodes[idx].next = p->doc->n_nodes;
        return idx;
    }
    uint32_t count = 0;
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != '"') {
            fail_char(p, "a string key in object");
            return LS_JSON_NONE;
        }
        if (parse_string(p) == LS_JSON_NONE) return LS_JSON_NONE;
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':') {
            fail_char(p, "':' after object key");
            return LS_JSON_NONE;
        }
        p->pos++;
        skip_ws(p);
        if (parse_value(p, depth + 1) == LS_JSON_NONE) return LS_JSON_NONE;
        count++;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == '}') {
            p->pos++;
            break;
        }
        fail_char(p, "',' or '}' in object");
        return LS_JSON_NONE;
    }
    p->doc->nodes[idx].count = count;
    p->doc->nodes[idx].next = p->doc->n_nodes;
    if (check_duplicates(p, idx) != 0) return LS_JSON_NONE;
    return idx;
}

static int match_word(parser *p, const char *w) {
    size_t n = strlen(w);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, w, n) != 0) return 0;
    p->pos += n;
    return 1;
}

static uint32_t parse_value(parser *p, int depth) {
    if (depth > LS_JSON_MAX_DEPTH) {
        fail(p, p->pos, "JSON nested deeper than 64 levels");
        return LS_JSON_NONE;
    }
    if (p->pos >= p->len) {
        fail_char(p, "a value");
        return LS_JSON_NONE;
    }
    unsigned char c = p->s[p->pos];
    if (c == '{') return parse_object(p, depth);
    if (c == '[') return parse_array(p, depth);
    if (c == '"') return parse_string(p);
    if (c == '-' || (c >= '0' && c <= '9')) {
        uint32_t idx = new_node(p, LS_JSON_NUMBER);
        if (idx == LS_JSON_NONE) return idx;
        ls_json_node *n = &p->doc->nodes[idx];
        size_t start = p->pos;
        if (scan_number(p->s, p->len, &p->pos, 0, &n->is_int, &n->i, &n->d) != 0) {
            fail(p, start, "invalid number");
            return LS_JSON_NONE;
        }
        return idx;
    }
    ls_json_type t;
    size_t start = p->pos;
    if (match_word(p, "true")) t = LS_JSON_TRUE;
    else if (match_word(p, "false")) t = LS_JSON_FALSE;
    else if (match_word(p, "null")) t = LS_JSON_NULL;
    else {
        fail_char(p, "a value");
        return LS_JSON_NONE;
    }
    uint32_t idx = new_node(p, t);
    if (idx != LS_JSON_NONE) p->doc->nodes[idx].offset = start;
    return idx;
}

// ---- public ----

int ls_json_parse(ls_json_doc *doc, const char *text, size_t len, char *err, int32_t err_len) {
    if (doc == NULL) return -1;
    memset(doc, 0, sizeof *doc);
    if (text == NULL) {
        ls_set_error(err, err_len, "no JSON text");
        return -1;
    }
    parser p = {0};
    p.s = (const unsigned char *)text;
    p.len = len;
    p.doc = doc;
    p.err = err;
    p.err_len = err_len;
    if (len == SIZE_MAX) {
        ls_set_error(err, err_len, "JSON text too long");
        return -1;
    }
    p.str_cap = len + 1;
    doc->strings = malloc(p.str_cap);
    if (!doc->strings) {
        ls_set_error(err, err_len, "out of memory parsing JSON (%zu bytes)", len);
        return -1;
    }
    skip_ws(&p);
    uint32_t root = parse_value(&p, 1);
    if (root != LS_JSON_NONE) {
        skip_ws(&p);
        if (p.pos != p.len) fail(&p, p.pos, "unexpected data after the JSON value");
    }
    if (p.failed || root == LS_JSON_NONE) {
        ls_json_free(doc);
        return -1;
    }
    return 0;
}

void ls_json_free(ls_json_doc *doc) {
    if (doc == NULL) return;
    free(doc->nodes);
    free(doc->strings);
    memset(doc, 0, sizeof *doc);
}

uint32_t ls_json_get(const ls_json_doc *doc, uint32_t obj, const char *key) {
    if (doc == NULL || key == NULL || obj >= doc->n_nodes) return LS_JSON_NONE;
    const ls_json_node *o = &doc->nodes[obj];
    if (o->type != LS_JSON_OBJECT) return LS_JSON_NONE;
    size_t klen = strlen(key);
    uint32_t k = obj + 1;
    for (uint32_t i = 0; i < o->count; i++) {
        const ls_json_node *kn = &doc->nodes[k];
        if (kn->len == klen && memcmp(kn->str, key, klen) == 0) return k + 1;
        k = doc->nodes[k + 1].next;
    }
    return LS_JSON_NONE;
}

const char *ls_json_type_name(ls_json_type t) {
    switch (t) {
    case LS_JSON_NULL: return "null";
    case LS_JSON_FALSE:
    case LS_JSON_TRUE: return "boolean";
    case LS_JSON_NUMBER: return "number";
    case LS_JSON_STRING: return "string";
    case LS_JSON_ARRAY: return "array";
    case LS_JSON_OBJECT: return "object";
    }
    return "unknown";
}
