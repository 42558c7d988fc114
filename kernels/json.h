/*
 * json.h — a small strict JSON parser for the safetensors header (internal).
 *
 * The input is untrusted: every read is bounded by the given length (no NUL
 * terminator needed), nesting is limited, strings must be valid UTF-8,
 * duplicate object keys are rejected (two readers could otherwise disagree
 * about which one counts), and errors name the byte offset.
 *
 * The parse produces a flat array of nodes in document order. A container's
 * children follow it directly; `next` skips a whole subtree. An object's
 * children alternate key (a STRING node) and value:
 *
 *     for (uint32_t i = 0, k = obj + 1; i < doc.nodes[obj].count; i++) {
 *         uint32_t v = k + 1;          // key node k, value node v
 *         ...
 *         k = doc.nodes[v].next;
 *     }
 */
#ifndef LOOPSERVE_JSON_H
#define LOOPSERVE_JSON_H

#include <stddef.h>
#include <stdint.h>

#define LS_JSON_MAX_DEPTH 64
#define LS_JSON_MAX_NODES (1u << 20) /* bounds memory for a hostile header */
#define LS_JSON_NONE UINT32_MAX

typedef enum {
    LS_JSON_NULL,
    LS_JSON_FALSE,
    LS_JSON_TRUE,
    LS_JSON_NUMBER,
    LS_JSON_STRING,
    LS_JSON_ARRAY,
    LS_JSON_OBJECT,
} ls_json_type;

typedef struct {
    ls_json_type type;
    uint32_t count;  /* ARRAY: elements; OBJECT: members (key/value pairs) */
    uint32_t next;   /* index of the node after this value's subtree */
    uint32_t len;    /* STRING: decoded length in bytes */
    size_t offset;   /* byte offset of the value in the input */
    const char *str; /* STRING: decoded UTF-8, NUL-terminated (may hold \u0000) */
    int is_int;      /* NUMBER: no fraction or exponent, and fits int64 */
    int64_t i;       /* NUMBER: the value when is_int */
    double d;        /* NUMBER: the value (nearest double, within an ulp or two) */
} ls_json_node;

typedef struct {
    ls_json_node *nodes;
    uint32_t n_nodes;
    char *strings; /* backing store of every decoded string */
} ls_json_doc;

/* Parses exactly one JSON value from text[0..len) (surrounding whitespace
 * allowed). Returns 0, or -1 with "<what> at byte <n>" written into err;
 * the doc is then empty and need not be freed (freeing it is harmless). */
int ls_json_parse(ls_json_doc *doc, const char *text, size_t len, char *err, int32_t err_len);
void ls_json_free(ls_json_doc *doc);

/* Value node of `key` in object node `obj`, or LS_JSON_NONE. */
uint32_t ls_json_get(const ls_json_doc *doc, uint32_t obj, const char *key);

/* "object", "string", ... for error messages. */
const char *ls_json_type_name(ls_json_type t);

/* Number parsing over text[0..len) as a whole (no whitespace, no "inf" or
 * "nan"), independent of the C locale. Return 0 and the value, or -1.
 * ls_json_parse_number: the JSON grammar exactly.
 * ls_parse_decimal: also "+1", "007", "5." and ".5", the grammar src/model/
 * format.ts accepts for metadata numbers, which the format stores as strings
 * ("10000", "1e-05"); the two loaders must accept the same files. */
int ls_json_parse_number(const char *text, size_t len, double *out);
int ls_parse_decimal(const char *text, size_t len, double *out);

#endif
