/*
 * loopserve.h — the whole ABI of libloopserve.so (and of libloopserve_cuda.so;
 * docs/abi.md is the map).
 *
 * A looped transformer: a stack of n_layers Llama-style layers (one, the
 * weight-shared block, in most models) applied `loops` times, each
 * application of the stack a step (docs/kernels.md, docs/model-format.md).
 * Every function is called from one thread (the server's JS thread); the
 * library parallelises internally with its own persistent thread pool.
 *
 * Conventions
 *   - Functions returning int32_t return 0 (or a non-negative value) on
 *     success and a negative ls_status (LS_ERR_*) on failure; failures that
 *     need words write a NUL-terminated message into the caller's `err`
 *     buffer. ls_status_str names every status.
 *   - Settings travel in parameter structs (ls_session_params,
 *     ls_step_params, ls_spec_params, ls_model_desc) rather than argument
 *     lists that grow with every feature. A field marked "default 0" may be
 *     left zero; fields named `reserved` must be 0.
 *   - Every optional capability is reported by ls_features(): a library
 *     defines every function below, and one whose feature it lacks returns
 *     LS_ERR_UNSUPPORTED.
 *   - Matrices are row-major [out_features, in_features] (nn.Linear).
 *   - fp16 means IEEE 754 binary16, little-endian.
 *   - Nothing here reads the environment: the caller passes every setting.
 *   - The numbers below are the only copy: build.ts generates the binding's
 *     constants and struct layouts (src/abi/abi.generated.ts) from this
 *     file, so plain literals only (no expressions) in #defines and enums.
 *
 * Hooks that exist only for tests are in kernels/testing.h, not here.
 */
#ifndef LOOPSERVE_H
#define LOOPSERVE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LS_ABI_VERSION 13

/* ---- status codes ---- */
typedef enum {
    LS_OK = 0,
    LS_ERR_ARG = -1,         /* an argument is out of range (token id, loops, n) */
    LS_ERR_FULL = -2,        /* the session has no room for more positions */
    LS_ERR_NOMEM = -3,       /* allocation failed */
    LS_ERR_STATE = -4,       /* call not valid in the session's current state */
    LS_ERR_UNSUPPORTED = -5, /* this library lacks the feature (see ls_features) */
} ls_status;

/* A short description of a status ("invalid argument", ...); never NULL,
 * "unknown status" for a value that is none of the above. */
const char *ls_status_str(int32_t status);

/* ---- optional capabilities ---- */
typedef enum {
    LS_FEATURE_SPECULATIVE = 1,   /* ls_spec_cycle, ls_spec_cycle_logits */
    LS_FEATURE_PROFILE = 2,       /* ls_model_set_profile, ls_model_profile_read */
    LS_FEATURE_KV_COMPRESSED = 4, /* kv_mode other than LS_KV_FP16 */
    LS_FEATURE_STACKS = 8,        /* n_layers > 1, sandwich and step norms, the exit gate (ls_model_config) */
    LS_FEATURE_QUANTIZED = 16,    /* int4 / int2 weights and int8 / int6 / int4 output heads (LS_QUANT_*, head_bits) */
    LS_FEATURE_TOKEN_MASK = 32,   /* masked draws: ls_step_params.masked, ls_spec_cycle_masked (token masks, below) */
    LS_FEATURE_QUANTIZE = 64,     /* ls_quantizer_new, ls_quantize: the weight quantizer */
    LS_FEATURE_RECURRENT = 128,   /* recurrent depth (ls_model_config): a prelude and a coda, input injection,
                                   * q/k biases, interleaved RoPE, head_dim other than dim / n_heads; the
                                   * zero-shot exit rules and cache_steps */
} ls_feature;

/* The LS_FEATURE_* bits this library implements. */
int32_t ls_features(void);

/* ---- SIMD paths, chosen once at load ---- */
typedef enum {
    LS_SIMD_AUTO = 0,     /* best the CPU supports */
    LS_SIMD_PORTABLE = 1, /* plain C: the reference path */
    LS_SIMD_AVX2 = 2,     /* AVX2 + FMA + F16C */
    LS_SIMD_AVX512 = 3,   /* AVX-512 F/BW/VL (+ VNNI where present) */
    LS_SIMD_CUDA = 4,     /* reported by the CUDA library in ls_model_info.simd; never requested */
} ls_simd;

/* ---- weight formats (metadata `quant`) ----
 *
 * fp16: every matrix X is `X.weight`, F16 [out, in].
 *
 * int4 / int2: the block's seven matrices (wq wk wv wo w1 w2 w3) are
 * quantized in groups of G = metadata `group_size` consecutive inputs of a
 * row (G in 32, 64, 128, 256; dim and ffn_dim multiples of G); tensors
 * `X.qweight`, `X.scales` (F16 [out, in / G], scale s of group g of row o at
 * [o, g]) and, int2 only, `X.zeros` (F16 [out, in / G]); no `X.weight`.
 * Each matrix has its own format (block_bits, 4 or 2; w1 and w3 alike): a
 * model's `quant` names most of them, and metadata `quant_mix` the others
 * (an int2 model keeping wv, wo and w2 at int4, say).
 *   int4  X.qweight U8 [out, in / 2]. Code c in [-8, 7] (symmetric), stored
 *         as the nibble c + 8; input 2j of a row in the low nibble of the
 *         row's byte j, input 2j + 1 in the high nibble.
 *         w = s * c (s may be negative: the quantizer uses the sign to put
 *         a group's larger side on the -8 end).
 *   int2  X.qweight U8 [out, in / 4]. Code c in 0..3; input 4j + k of a row
 *         in bits 2k..2k+1 of the row's byte j (input 4j in the low bits).
 *         w = s * c + z (z from X.zeros: scale and offset per group).
 * The norms stay F16, and so does the token embedding where it is stored
 * (an embedding row is gathered, never multiplied).
 *
 * The output head, in a model of any of these formats, is one of:
 *   F16    `output.weight` F16 [vocab, dim];
 *   tied   absent: tok_embeddings (F16) is reused; ls_model_info.tied_output
 *          is 1 only in this case;
 *   int8 / int6 / int4 (head_bits 8, 6, 4): `output.qweight` and
 *          `output.scales` F16 [vocab, dim / GH], GH = head_group, w = s * c
 *          with the symmetric code c of a group:
 *     int8  I8 [vocab, dim], c in [-127, 127] (two's complement bytes);
 *     int6  U8 [vocab, dim * 3 / 4] (dim a multiple of 64), c in [-32, 31]
 *           stored as u = c + 32: a row is dim / 2 bytes holding the low
 *           four bits of u as int4 holds its nibbles, then dim / 4 bytes of
 *           the high two bits, 16 bytes per 64 inputs: those of input
 *           64 b + 2 j + e (j < 32, e in 0..1) are bits 4 (j / 16) + 2 e of
 *           byte 16 b + j % 16 (so the 32 nibble bytes of 64 inputs and
 *           their 16 high-bit bytes line up for SIMD loads);
 *     int4  U8 [vocab, dim / 2], exactly as the block's int4 matrices.
 *
 * The token embedding is `tok_embeddings.weight` F16 [vocab, dim], or, in a
 * model with a quantized head, absent: the head is then tied to it, and
 * token t's embedding is row t of the head dequantized (s * c in fp32,
 * exact), so a tied model keeps one copy of the matrix, quantized.
 *
 * Kernels (kernels/quant.h): each activation row is quantized to int8 with
 * one fp32 scale, each group is an exact integer dot product, and the
 * groups are combined in fp32 in one fixed order on every SIMD path, so
 * quantized matmuls are bit-identical across paths, batch sizes and thread
 * counts. */
typedef enum {
    LS_QUANT_FP16 = 0,
    LS_QUANT_INT4 = 1,
    LS_QUANT_INT2 = 2,
} ls_quant;

typedef struct ls_model ls_model;
typedef struct ls_session ls_session;

/* Model description, filled by ls_model_info_get. All fields are 32-bit so
 * a binding can read the struct through one Int32Array/Float32Array pair. */
typedef struct {
    int32_t dim;            /* residual width */
    int32_t n_heads;        /* query heads */
    int32_t n_kv_heads;     /* key/value heads (GQA: n_heads % n_kv_heads == 0) */
    int32_t head_dim;       /* per-head width, even (dim / n_heads unless the file names another) */
    int32_t ffn_dim;        /* SwiGLU hidden width */
    int32_t vocab_size;
    int32_t default_loops;
    int32_t max_seq_len;    /* from the file's metadata */
    float rope_theta;
    float norm_eps;
    int32_t quant;          /* LS_QUANT_* */
    int32_t group_size;     /* quantization group; 0 for fp16 */
    int32_t tied_output;    /* 1 when output.weight is absent and E is reused */
    int32_t simd;           /* LS_SIMD_* actually in use */
    int32_t n_threads;      /* threads in the pool (including the caller) */
    int32_t head_bits;      /* the output head's format: 8, 6, 4, or 0 (F16 or tied) */
    int32_t head_group;     /* its group (0 when head_bits is 0) */
    int32_t embed_from_head; /* 1 when tok_embeddings is absent and the quantized head's rows serve as the embedding */
    int32_t block_bits[7];  /* each block matrix's format, wq wk wv wo w1 w2 w3: 4 or 2; 0 in an fp16 model */
    int32_t n_layers;       /* distinct layers applied in order each step (loop): the looped core */
    int32_t sandwich_norm;  /* LS_NORM_*: 0 pre-norm, 1 sandwich (each sublayer's output normed before the residual
                             * add), 2 sandwich_sum (the residual sum normed after each add) */
    int32_t step_norm;      /* 1: h = rmsnorm(h, norm) after every step; the head then norms no further */
    int32_t exit_gate;      /* 1: the model has a learned exit gate (ls_step_params.exit_threshold) */
    /* recurrent depth (ls_model_config's fields of the same names) */
    int32_t n_prelude;      /* layers run once before the core */
    int32_t n_coda;         /* layers run once after it */
    int32_t injection;      /* LS_INJECT_* */
    float embed_scale;      /* the embedding's factor */
    float state_std;        /* the first step's state (LS_INJECT_ADAPTER) */
    int32_t mid_norm;       /* 1: norm.weight on the core's output before the coda */
    int32_t rope_interleaved; /* 1: RoPE rotates adjacent pairs (2i, 2i + 1) */
    int32_t qk_bias;        /* 1: every layer adds wq.bias / wk.bias to q / k before RoPE */
} ls_model_info;

int32_t ls_abi_version(void);

/* Human-readable name of a LS_SIMD_* path ("portable", "avx2", "avx512"). */
const char *ls_simd_name(int32_t simd);

/* ---- model ---- */

/* ---- model descriptor ----
 *
 * The model file is validated by the caller (the TypeScript loader,
 * src/model/format.ts: header, metadata, every tensor's dtype and shape),
 * which then describes it to the library: the model's dimensions and, for
 * each tensor the model uses, where its bytes lie in the file. The library
 * maps the file and trusts none of it: it checks the dimensions' ranges and
 * consistency, that every tensor the weight format needs is given (and none
 * it does not), each one's dtype and byte length against the dimensions,
 * that it lies inside the file, is aligned to its element size and overlaps
 * no other, and that every fp16 value is finite. */

/* Largest dimensions a model may have: they keep every size product far
 * from overflow. */
#define LS_MAX_DIM 65536
#define LS_MAX_HEADS 4096
#define LS_MAX_FFN_DIM 262144
#define LS_MAX_VOCAB 1048576
#define LS_MAX_SEQ_LEN 1048576
#define LS_MAX_LOOPS 64
#define LS_MAX_LAYERS 128
#define LS_MAX_ROPE_THETA 1e12 /* rope_theta < this */
#define LS_MAX_NORM_EPS 1.0    /* norm_eps < this */

/* The model's dimensions (the file's metadata). */
/* Quantization group sizes a model may use: the powers of two from MIN to MAX. */
#define LS_QUANT_GROUP_MIN 32
#define LS_QUANT_GROUP_MAX 256

typedef struct {
    int32_t dim;            /* residual width, 1..LS_MAX_DIM, a multiple of n_heads */
    int32_t n_heads;        /* 1..LS_MAX_HEADS; dim / n_heads even */
    int32_t n_kv_heads;     /* 1..LS_MAX_HEADS, dividing n_heads */
    int32_t ffn_dim;        /* 1..LS_MAX_FFN_DIM */
    int32_t vocab_size;     /* 1..LS_MAX_VOCAB */
    int32_t default_loops;  /* 1..LS_MAX_LOOPS */
    int32_t max_seq_len;    /* 1..LS_MAX_SEQ_LEN */
    float rope_theta;       /* (0, LS_MAX_ROPE_THETA) */
    float norm_eps;         /* (0, LS_MAX_NORM_EPS) */
    int32_t quant;          /* LS_QUANT_* */
    int32_t group_size;     /* 0 for fp16; otherwise a power of two in [LS_QUANT_GROUP_MIN, LS_QUANT_GROUP_MAX] dividing dim and ffn_dim */
    int32_t head_bits;      /* 8, 6 or 4: output.qweight holds the head in that format; 0: F16 or tied head */
    int32_t head_group;     /* head_bits > 0: its group, a power of two in [LS_QUANT_GROUP_MIN, LS_QUANT_GROUP_MAX] dividing dim; else 0 */
    int32_t block_bits[7];  /* each block matrix's format, wq wk wv wo w1 w2 w3: 4 (int4) or 2 (int2), w1 and w3
                               alike, in an int4 or int2 model; all 0 in an fp16 model (every layer alike) */
    int32_t n_layers;       /* 1..LS_MAX_LAYERS layers per step; default 0 reads as 1 */
    int32_t sandwich_norm;  /* 0 or 1: attn_out_norm / ffn_out_norm norm each sublayer's output before its
                               residual add (the layers' ATTN_OUT_NORM / FFN_OUT_NORM slots) */
    int32_t step_norm;      /* 0 or 1: norm.weight is applied to h after every step, whose output goes on to
                               the next step and to the head (which then applies no norm of its own) */
    /* Recurrent depth (LS_FEATURE_RECURRENT; every field default 0 = the stack above). A token's pass is
     *   e = prelude(E[token] * embed_scale)              n_prelude layers, once
     *   x = injection ? state0(pos) : e
     *   each step: x = injection ? adapter . concat[x, e] : x;  the core's n_layers layers; step_norm
     *   mid_norm: x = rmsnorm(x, norm);  x = coda(x)     n_coda layers, once
     *   logits = (step_norm and no coda ? x : rmsnorm(x, norm)) . Wout
     * (docs/model-format.md). The prelude's and coda's layers are descriptor layers n_layers.. and
     * n_layers + n_prelude.., named "prelude.<i>." and "coda.<i>." in the file. */
    int32_t head_dim;       /* 0: dim / n_heads; else the per-head width (even, <= LS_MAX_DIM); q and the
                               attention output are n_heads * head_dim wide */
    int32_t n_prelude;      /* 0..LS_MAX_LAYERS layers before the core (n_layers + n_prelude + n_coda <= LS_MAX_LAYERS) */
    int32_t n_coda;         /* 0..LS_MAX_LAYERS layers after it */
    int32_t injection;      /* LS_INJECT_*: the core's input at each step */
    float embed_scale;      /* 0 reads as 1: the embedding is multiplied by it (finite, > 0) */
    float state_std;        /* LS_INJECT_ADAPTER: std of the first step's state, >= 0 (0: zeros). state0(pos)
                               element i is state_std * z, z the standard normal truncated to [-3, 3] of
                               (pos, i) written out below: the same for every request */
    int32_t mid_norm;       /* 0 or 1 (with a coda): norm.weight applied to the core's output before the coda */
    int32_t rope_interleaved; /* 0: RoPE rotates (i, i + head_dim / 2) (Llama); 1: (2i, 2i + 1) */
    int32_t qk_bias;        /* 0 or 1: every layer's WQ_BIAS / WK_BIAS slots hold biases added before RoPE */
} ls_model_config;

/* Where a layer's norms sit (ls_model_config.sandwich_norm). */
typedef enum {
    LS_NORM_PRE = 0,          /* h += attn(rmsnorm(h)); h += ffn(rmsnorm(h)) */
    LS_NORM_SANDWICH = 1,     /* h += rmsnorm(attn(rmsnorm(h)), attn_out_norm); likewise the ffn (Ouro) */
    LS_NORM_SANDWICH_SUM = 2, /* h = rmsnorm(h + attn(rmsnorm(h)), attn_out_norm); likewise the ffn (Huginn) */
} ls_norm_layout;

/* The core's input at each step (ls_model_config.injection). */
typedef enum {
    LS_INJECT_NONE = 0,    /* the previous step's output (the first step: e) */
    LS_INJECT_ADAPTER = 1, /* ADAPTER_WEIGHT [dim, 2 dim] . concat[previous output (the first step: state0), e] */
} ls_injection;

/* The first step's state of an adapter model (LS_INJECT_ADAPTER), element i at
 * position pos, before state_std: a standard normal truncated to [-3, 3],
 * the same on every machine. With u(c) = the uniform in [0, 1) of counter c
 * under seed mix64(0x7374617465 ^ pos) (ls_sample's generator, sample.c), for
 * attempt a = 0, 1, ... (at most 64; then 0): c = 2 (64 i + a),
 * z = sqrt(-2 ln(1 - u(c))) cos(2 pi u(c + 1)) in double, taken when
 * |z| <= 3. */

/* Element types of the tensors a model holds (safetensors' names). */
typedef enum {
    LS_DTYPE_NONE = 0, /* the tensor is absent */
    LS_DTYPE_F16 = 1,
    LS_DTYPE_U8 = 2,
    LS_DTYPE_I8 = 3,
} ls_dtype;

/* Every tensor a model may hold, as X(ID, "name in the file"): the
 * model-wide ones here (slot LS_TENSOR_<ID> of ls_model_desc.tensors), each
 * layer's in LS_LAYER_TENSORS. */
#define LS_TENSORS(X)                           \
    X(TOK_EMBEDDINGS, "tok_embeddings.weight")  \
    X(NORM, "norm.weight")                      \
    X(OUTPUT_WEIGHT, "output.weight")           \
    X(OUTPUT_QWEIGHT, "output.qweight")         \
    X(OUTPUT_SCALES, "output.scales")           \
    X(EXIT_GATE_WEIGHT, "exit_gate.weight")     \
    X(EXIT_GATE_BIAS, "exit_gate.bias")         \
    X(ADAPTER_WEIGHT, "adapter.weight")

enum {
#define LS_TENSOR_ENUM_(id, name) LS_TENSOR_##id,
    LS_TENSORS(LS_TENSOR_ENUM_)
#undef LS_TENSOR_ENUM_
    LS_TENSOR_N
};

/* One layer's tensors: slot LS_LAYER_TENSOR_<ID> of ls_model_desc.layers[i],
 * named in the file "block." + name in a one-layer core and "layers.<i>." +
 * name otherwise; the prelude's layers (descriptor layers n_layers + i) are
 * "prelude.<i>." + name, the coda's (n_layers + n_prelude + i) "coda.<i>." +
 * name. The seven matrices come in the same four-slot pattern
 * (weight, qweight, scales, zeros), in the order wq wk wv wo w1 w2 w3. Which
 * slots a weight format fills, and with what, is written down at LS_QUANT_*
 * above. The exit gate (EXIT_GATE_WEIGHT F16 [1, dim], EXIT_GATE_BIAS F16
 * [1]) is both present or both absent. ADAPTER_WEIGHT (F16 [dim, 2 dim],
 * fp16 in every weight format) is present exactly with LS_INJECT_ADAPTER;
 * WQ_BIAS (F16 [n_heads head_dim]) and WK_BIAS (F16 [n_kv_heads head_dim])
 * exactly with qk_bias, in every layer. */
#define LS_LAYER_TENSORS(X)               \
    X(ATTN_NORM, "attn_norm.weight")      \
    X(FFN_NORM, "ffn_norm.weight")        \
    X(ATTN_OUT_NORM, "attn_out_norm.weight") \
    X(FFN_OUT_NORM, "ffn_out_norm.weight") \
    X(WQ_WEIGHT, "wq.weight")             \
    X(WQ_QWEIGHT, "wq.qweight")           \
    X(WQ_SCALES, "wq.scales")             \
    X(WQ_ZEROS, "wq.zeros")               \
    X(WK_WEIGHT, "wk.weight")             \
    X(WK_QWEIGHT, "wk.qweight")           \
    X(WK_SCALES, "wk.scales")             \
    X(WK_ZEROS, "wk.zeros")               \
    X(WV_WEIGHT, "wv.weight")             \
    X(WV_QWEIGHT, "wv.qweight")           \
    X(WV_SCALES, "wv.scales")             \
    X(WV_ZEROS, "wv.zeros")               \
    X(WO_WEIGHT, "wo.weight")             \
    X(WO_QWEIGHT, "wo.qweight")           \
    X(WO_SCALES, "wo.scales")             \
    X(WO_ZEROS, "wo.zeros")               \
    X(W1_WEIGHT, "w1.weight")             \
    X(W1_QWEIGHT, "w1.qweight")           \
    X(W1_SCALES, "w1.scales")             \
    X(W1_ZEROS, "w1.zeros")               \
    X(W2_WEIGHT, "w2.weight")             \
    X(W2_QWEIGHT, "w2.qweight")           \
    X(W2_SCALES, "w2.scales")             \
    X(W2_ZEROS, "w2.zeros")               \
    X(W3_WEIGHT, "w3.weight")             \
    X(W3_QWEIGHT, "w3.qweight")           \
    X(W3_SCALES, "w3.scales")             \
    X(W3_ZEROS, "w3.zeros")               \
    X(WQ_BIAS, "wq.bias")                 \
    X(WK_BIAS, "wk.bias")

enum {
#define LS_LAYER_TENSOR_ENUM_(id, name) LS_LAYER_TENSOR_##id,
    LS_LAYER_TENSORS(LS_LAYER_TENSOR_ENUM_)
#undef LS_LAYER_TENSOR_ENUM_
    LS_LAYER_TENSOR_N
};

/* Where one tensor's bytes lie in the file. */
typedef struct {
    uint64_t offset;  /* from the start of the file */
    uint64_t length;  /* bytes */
    int32_t dtype;    /* LS_DTYPE_*; LS_DTYPE_NONE: absent (offset and length 0) */
    int32_t reserved; /* 0 */
} ls_tensor_span;

/* One layer's tensors, indexed by LS_LAYER_TENSOR_*. */
typedef struct {
    ls_tensor_span t[LS_LAYER_TENSOR_N];
} ls_layer_spans;

typedef struct {
    ls_model_config config;
    ls_tensor_span tensors[LS_TENSOR_N];   /* indexed by LS_TENSOR_* */
    ls_layer_spans layers[LS_MAX_LAYERS];  /* [0, n_layers) describe the layers; the rest all absent */
} ls_model_desc;

/* Maps the model file at path, checks desc against it (see above), starts
 * the thread pool (n_threads <= 0: all online cores) and selects the SIMD
 * path (simd is LS_SIMD_*; asking for a path the CPU lacks is an error).
 * On failure returns NULL and writes why into err (naming the field or
 * tensor at fault). */
ls_model *ls_model_load(const char *path, const ls_model_desc *desc, int32_t n_threads, int32_t simd,
                        char *err, int32_t err_len);
void ls_model_free(ls_model *m);
void ls_model_info_get(const ls_model *m, ls_model_info *out);

/* The memory of the device the model runs on, its weights loaded: bytes
 * free and in all. LS_ERR_UNSUPPORTED from a library whose models live in
 * host memory (the CPU library), which has no device to report. */
int32_t ls_model_device_memory(const ls_model *m, uint64_t *free_bytes, uint64_t *total_bytes);

/* Checks desc against the model file exactly as ls_model_load does, without
 * starting a runtime: with the caller's validation of the file, what
 * `loopserve model inspect` reports. Returns LS_OK and fills info (nullable;
 * simd and n_threads 0), or LS_ERR_ARG with the reason in err. */
int32_t ls_model_check(const char *path, const ls_model_desc *desc, ls_model_info *info, char *err,
                       int32_t err_len);

/* ---- per-op time breakdown (SERVICE_PROFILE / `loopserve bench --profile`) ----
 * Off by default (no clock reads). When on, every forward pass adds the
 * wall time of each op, measured on the calling thread, to the model's
 * counters; it changes no computed value. ls_model_profile_read copies up to
 * n counters (seconds, LS_PROF_* order) into out, optionally zeroes them, and
 * returns LS_PROF_N. Ops are listed as X(ID, "name shown in reports");
 * LS_PROF_<ID> is each one's index. A library without LS_FEATURE_PROFILE
 * ignores set_profile and returns LS_ERR_UNSUPPORTED from profile_read. */
#define LS_PROFILE_OPS(X)            \
    X(EMBED, "embed")                \
    X(RMSNORM, "rmsnorm")            \
    X(QKV, "qkv")                    \
    X(ATTN, "rope+attention")        \
    X(WO, "wo")                      \
    X(FFN_GATE_UP, "ffn gate/up")    \
    X(FFN_DOWN, "ffn down")          \
    X(HEAD, "head")                  \
    X(SAMPLE, "sampling")            \
    X(DRAFT_HEAD, "draft head") /* speculative drafts' head (the verifier's is HEAD) */ \
    X(INJECT, "injection")      /* a step's input injection (LS_INJECT_ADAPTER) */

enum {
#define LS_PROF_ENUM_(id, name) LS_PROF_##id,
    LS_PROFILE_OPS(LS_PROF_ENUM_)
#undef LS_PROF_ENUM_
    LS_PROF_N
};
void ls_model_set_profile(ls_model *m, int32_t on);
int32_t ls_model_profile_read(ls_model *m, double *out, int32_t n, int32_t reset);

/* ---- session: one request's KV cache ---- */

/* ---- key/value cache modes (docs/kv-cache.md), fixed per session ----
 *
 * kv_mode = one format, optionally ORed with flags. Every row (one loop,
 * position and kv head: head_dim values of K or of V) is stored on its own:
 * how a row is encoded depends on that row only (batch invariance).
 *   LS_KV_FP16  head_dim fp16 values.
 *   LS_KV_INT8  head_dim int8 codes c in [-127, 127] and one fp16 scale s
 *               = fp16(max|x| / 127) (at least the smallest subnormal when
 *               max|x| > 0); x ~ c * s.
 *   LS_KV_INT4  codes c in 0..15 in groups of LS_KV_INT4_GROUP (32) along
 *               head_dim (the last group shorter when head_dim is not a
 *               multiple of it), an fp16 offset z = fp16(min) and scale
 *               s = fp16((max - z) / 15) per group; x ~ c * s + z. Two codes per byte: byte i of a
 *               group of L values holds value i in the low nibble and value
 *               L/2 + i in the high nibble.
 * Attention dequantizes in registers (c * s (+ z) in fp32) as it reads the
 * codes. kernels/cpu/kvcache.h has the layouts.
 * Flags:
 *   LS_KV_HADAMARD  K and V rows are rotated by the normalized Walsh-Hadamard
 *                   transform (head_dim must be a power of two) before they
 *                   are stored or quantized; q is rotated the same way and
 *                   each head's attention output rotated back, so scores and
 *                   outputs equal the unrotated ones up to rounding.
 *   LS_KV_FP16_QKV  with LS_KV_HADAMARD only: q, k and v are rounded to fp16
 *                   before the rotation (as a GPU fp16 path computes them). */
#define LS_KV_INT4_GROUP 32 /* LS_KV_INT4: values per offset and scale along head_dim */

typedef enum {
    LS_KV_FP16 = 0,
    LS_KV_INT8 = 1,
    LS_KV_INT4 = 2,
    LS_KV_FORMAT_MASK = 255,
    LS_KV_HADAMARD = 256,
    LS_KV_FP16_QKV = 512,
} ls_kv_mode;

/* A session's fixed settings: it owns one K/V cache per loop for up to
 * `loops` loops. */
typedef struct {
    int32_t max_seq;      /* most positions the session will ever hold (prompt + output), >= 1 */
    int32_t loops;        /* loops it keeps caches for, >= 1 */
    int32_t cache_window; /* default 0 = full attention; W > 0 = each position attends only to
                           * the last W positions (itself included); the cache then holds a
                           * bounded ring of positions instead of max_seq */
    int32_t kv_mode;      /* LS_KV_*, default 0 = LS_KV_FP16 */
    int32_t cache_steps;  /* default 0 = every cache unit its own. S in [1, loops) (LS_FEATURE_RECURRENT): the
                           * core's units share S steps of caches, unit u in slot u mod (S n_layers): a
                           * position's later steps overwrite its earlier ones, so a later position reads, at
                           * each step, the last step of each earlier position that wrote the slot, while the
                           * positions of one chunk (LS_CHUNK positions of a call or a batch row, which a batch
                           * never splits otherwise) read each other's rows of the same step (the published
                           * Huginn code's compress-s policy; docs/kv-cache.md). Not with a window, the exact
                           * exit policy (its deferred steps would rewrite rows later positions read), a
                           * speculative cycle or a prefix copy (LS_ERR_ARG / LS_ERR_STATE). */
} ls_session_params;

/* A new, empty session. A setting the library cannot run (out of range;
 * for kv_mode unknown bits, a flag without its prerequisite, LS_KV_HADAMARD
 * with a head_dim that is not a power of two, or a compressed mode without
 * LS_FEATURE_KV_COMPRESSED) is refused: NULL and the reason in err. The
 * CPU library allocates the key/value cache in blocks as positions arrive:
 * a call that needs more room than the session holds grows it first, or
 * returns LS_ERR_NOMEM with the session unchanged. Freed and outgrown
 * buffers (up to 64 MiB) are kept by the model for its next sessions.
 * Free every session of a model before the model. */
ls_session *ls_session_new(ls_model *m, const ls_session_params *params, char *err, int32_t err_len);
void ls_session_free(ls_session *s);

/* Bytes of key/value cache a session made with params holds at most, once
 * every position it can hold is fed (its scratch not counted), or a negative
 * LS_ERR_* for parameters ls_session_new would refuse: what a server
 * budgets cache memory by. */
int64_t ls_session_cache_bytes(const ls_model *m, const ls_session_params *params);

/* Bytes of key/value cache the session holds now (<= ls_session_cache_bytes
 * of its parameters), or LS_ERR_ARG for NULL. */
int64_t ls_session_cache_bytes_held(const ls_session *s);

/* Number of positions held (tokens fed so far minus rollbacks). */
int32_t ls_session_pos(const ls_session *s);

/* Forgets positions >= pos in every loop's cache (pos <= current pos). */
int32_t ls_session_rollback(ls_session *s, int32_t pos);

/* Copies positions [0, n) of src — every loop's K/V rows the dst needs and
 * the token history — into dst, which must be empty (pos 0), of the same
 * model, cache_window and kv_mode (else LS_ERR_STATE), with loops <= src's
 * loops and room for n positions; src must hold at least n positions in
 * those loops. dst then continues exactly as src would have from position
 * n (bit-identical): this is how a pooled prompt prefix is reused. */
int32_t ls_session_copy_prefix(ls_session *dst, const ls_session *src, int32_t n);

/* Runs n tokens at positions [pos, pos + n) through `loops` loops
 * (1 <= loops <= the session's loops), appending them to the cache.
 * logits_out: NULL, or room for n_logits * vocab_size floats that receive
 * the logits of the LAST n_logits tokens (1 <= n_logits <= n).
 * Batch-invariant: a token's logits are bit-identical whatever n, the
 * split of a prompt into calls, or the thread count. */
int32_t ls_session_forward(ls_session *s, const int32_t *tokens, int32_t n,
                           int32_t loops, float *logits_out, int32_t n_logits);

/* How a token is drawn: ls_sample's procedure and its inputs besides the
 * logits and the history. */
typedef struct {
    float temperature;        /* 0 = greedy */
    int32_t top_k;            /* 0 = all */
    float top_p;              /* 1 = all */
    float repetition_penalty; /* 1 = none */
    uint64_t seed;
} ls_sampling;

/* How a sampled token may stop before its `loops` steps (docs/early-exit.md):
 * a policy, ORed with the rule that decides (default: the model's exit
 * gate). */
typedef enum {
    LS_EXIT_NONE = 0,  /* fixed depth: every token runs `loops` steps */
    LS_EXIT_EXACT = 1, /* early exit; a later token that goes deeper first computes the skipped steps
                        * of the tokens before it, so every output equals computing every step for
                        * every token and taking each token's logits from its exit step */
    LS_EXIT_COPY = 2,  /* early exit; the skipped steps' cache units receive copies of the exit
                        * step's keys/values (cheaper, outputs differ from every-step) */
    LS_EXIT_POLICY_MASK = 255,
    LS_EXIT_RULE_KL = 256,      /* zero-shot rule (any model): KL(previous step || this step) < threshold */
    LS_EXIT_RULE_ENTROPY = 512, /* zero-shot rule: |entropy(this step) - entropy(previous step)| < threshold */
} ls_exit_policy;

/* One step's settings: the depth, the exit rule and the sampling.
 * Everything else a step depends on is the session's own: its position,
 * window, cache mode and token history. A batched step (ls_batch_step)
 * takes one per row. */
typedef struct {
    int32_t loops;          /* 1..the session's loops: the most steps the token runs */
    int32_t exit_policy;    /* LS_EXIT_*, default 0 = fixed depth; the gate's rule needs a model with an exit gate */
    float exit_threshold;   /* with an exit policy (below): 0..1 for the gate, finite >= 0 for a zero-shot rule;
                             * ignored without one */
    int32_t masked;         /* default 0; 1: the draw is restricted to the tokens the row's token mask allows
                             * (ls_batch_step's masks; a sampling row only, LS_FEATURE_TOKEN_MASK) */
    ls_sampling sampling;
} ls_step_params;

/* Token masks (structured output, docs/structured-output.md): which tokens a
 * draw may return. A mask is (vocab_size + 31) / 32 uint32 words; token t is
 * allowed when bit t % 32 of word t / 32 is set (bits past vocab_size are
 * ignored). A masked draw first sets every logit the mask does not allow to
 * -inf, then draws as ls_sample does: greedy picks the best allowed token,
 * sampling draws from the distribution renormalised over the allowed ones.
 * The logits a masked step hands back (logits_out) are the masked logits,
 * so log-probabilities computed from them are the masked distribution's.
 * A mask that allows no token makes the draw fail (LS_ERR_ARG). */

/* Learned early exit (docs/early-exit.md). After each step s of the token
 * whose logits are sampled, the gate gives lambda_s = sigmoid(h . w + b)
 * (fp32) and the exit distribution p_s = lambda_s * r_s, r_{s+1} = r_s *
 * (1 - lambda_s), r_0 = 1, with p = r at the last step (loops - 1). The
 * token stops after the first step whose cumulative p reaches
 * exit_threshold (0: after the first step); its logits come from that
 * step's h. The other tokens of a call (prompt positions before the last)
 * run all `loops` steps.
 *
 * LS_EXIT_EXACT keeps the exiting token's hidden state; the units of its
 * skipped steps are computed when a later token of the session first needs
 * them (every token at step s attends to every earlier token's step-s
 * keys/values), as extra rows of the step that needs them, or, for many
 * positions, in chunks before it. A session holding such deferred units
 * (ls_session_cache_bytes counts their states) serves every entry point:
 * each computes what it needs first. Not with a cache window (LS_ERR_ARG):
 * a window drops rows the deferred steps would read.
 * LS_EXIT_COPY gives every deeper unit of each layer a copy of the
 * keys/values the token stored in its exit step's unit of the same layer
 * (with cache_steps, only the shared slots its steps did not reach; one
 * they reached keeps its latest write, as the published Huginn code's
 * compress-s cache with its latest-m4 lookup reads it).
 *
 * Zero-shot rules (LS_EXIT_RULE_KL, LS_EXIT_RULE_ENTROPY: the published
 * Huginn code's criteria, no gate needed). After each step s but the last of
 * a row feeding one token (a longer row, a prompt chunk, runs every step),
 * the token's logits at step s are computed (the mid norm, the coda, the head:
 * a probe, which also writes the coda's keys/values at its position) and
 * with p_s = softmax(logits), in double:
 *   KL:      v_s = sum_i p_{s-1,i} (log p_{s-1,i} - log p_{s,i}), p_{-1} uniform
 *   entropy: v_s = |H_s - H_{s-1}|, H = -sum_i p_i log(p_i + 1e-10), H_{-1} = 100
 * The token exits after the first step with v_s < exit_threshold (0: never);
 * its logits are that probe's. The policies are the gate's. */

/* Steps the session's last sampled token ran (its exit step + 1; the
 * call's loops without early exit), or LS_ERR_ARG for NULL. */
int32_t ls_session_last_steps(const ls_session *s);

/* One generation step in one call (params->masked 0: a masked step goes
 * through ls_batch_step): ls_session_forward of the n tokens at
 * params->loops, then ls_sample on the last token's logits with the
 * session's whole token history (prompt + generated) for the repetition
 * penalty, and the RNG counter = the position the sampled token will
 * occupy. Returns the token id, or a negative LS_ERR_*. logits_out
 * (nullable) receives the last token's logits before any sampling
 * transform. */
int32_t ls_session_step(ls_session *s, const int32_t *tokens, int32_t n, const ls_step_params *params,
                        float *logits_out);

/* ---- batched step (batch.c, docs/batching.md) ---- */

#define LS_BATCH_MAX_ROWS 256 /* rows one ls_batch_step call takes */

/* One row of a batched step: the tokens it feeds its session, and whether
 * it samples the next token. */
typedef struct {
    int32_t n_tokens;    /* >= 1: the next n_tokens of the call's token array, fed at the session's position */
    int32_t sample;      /* 1: sample as ls_session_step does; 0: forward only (a prompt chunk before its last) */
    ls_step_params step; /* loops always; the sampling fields only when sample is 1 */
} ls_batch_row;

/* Advances n_rows distinct sessions of model m in one call: row i feeds
 * its tokens to sessions[i] at rows[i].step.loops and, when it samples,
 * draws out[i] exactly as ls_session_step would (out[i] = 0 otherwise).
 * The tokens of all rows lie one after another in `tokens`. masks: NULL
 * when no row is masked, else n_rows token masks one after another (row
 * i's at i * words, read only for rows with step.masked 1): a masked row
 * draws under its mask. logits_out: NULL, or (n_rows, vocab) floats whose
 * row i receives a sampling row's last logits before any sampling transform
 * but the mask (other rows untouched).
 *
 * Every row's logits and token are bit-identical to running it alone with
 * ls_session_step / ls_session_forward: the matmuls read the weights once
 * for all rows, but no row's arithmetic depends on the others. Rows of
 * different depths share the loops they have in common.
 *
 * Every row is checked before any session changes: on a bad row the call
 * returns its error (LS_ERR_ARG, LS_ERR_FULL, LS_ERR_STATE), writes each
 * row's own status to out (LS_OK for good rows) and changes nothing. A
 * session whose cache cannot grow for its row gives LS_ERR_NOMEM the same
 * way, before any row runs. */
int32_t ls_batch_step(ls_model *m, ls_session *const *sessions, const ls_batch_row *rows, int32_t n_rows,
                      const int32_t *tokens, const uint32_t *masks, float *logits_out, int32_t *out);

/* Pipelined steps: ls_batch_step in two halves, so the caller's thread is
 * free while the step runs (docs/serving-overhead.md): ls_pipeline_begin
 * hands the call, as given, to a thread of the model's own and returns at
 * once (LS_ERR_STATE while a step begun before has not been ended);
 * ls_pipeline_end waits for it and returns what ls_batch_step returned, its
 * outputs written. Until then every array passed stays valid and unchanged,
 * and the caller makes no other call on m or its sessions, with one
 * exception: the masks. A step with masked rows runs its forward pass and
 * then waits, before its draws, for ls_pipeline_masks_ready; until that
 * call the caller may still write `masks` (so a server computes the next
 * token masks while the step's forward pass runs). ls_pipeline_end makes
 * the masks ready if that call has not. Results are ls_batch_step's, bit
 * for bit, with the masks as they were when made ready. */
int32_t ls_pipeline_begin(ls_model *m, ls_session *const *sessions, const ls_batch_row *rows, int32_t n_rows,
                          const int32_t *tokens, const uint32_t *masks, float *logits_out, int32_t *out);
int32_t ls_pipeline_masks_ready(ls_model *m);
int32_t ls_pipeline_end(ls_model *m);

/* ---- sampling ---- */

/* Picks a token from logits (left unchanged):
 *   repetition penalty (CTRL/HF rule: a logit l of a token in history
 *   becomes l / penalty if l > 0 else l * penalty), then
 *   temperature == 0: argmax (lowest id on ties); otherwise softmax of
 *   logits / temperature restricted to the top_k most likely (0 = all),
 *   then to the smallest prefix whose mass reaches top_p (1 = all),
 *   renormalised, and drawn with a counter-based RNG: the uniform for
 *   (seed, counter) is the same on every machine and thread count.
 *   top_p == 0 keeps only the most likely token; NaN logits count as -inf.
 *   The exact procedure is written out at the top of sample.c.
 * Returns the token id, LS_ERR_ARG (bad parameter, no usable logit) or
 * LS_ERR_NOMEM. */
int32_t ls_sample(const float *logits, int32_t vocab, const int32_t *history, int32_t n_history,
                  const ls_sampling *sampling, uint64_t counter);

/* ---- speculative decoding (spec.c, docs/speculative.md) ---- */

#define LS_SPEC_MAX_AHEAD 16    /* draft_ahead: tokens drafted per cycle (chain) or tree depth */
#define LS_SPEC_MAX_BRANCHES 16 /* k_branches */
#define LS_SPEC_MAX_NODES 64    /* k_branches * draft_ahead */

/* ls_spec_params.flags (kernels/testing.h adds a test-only one) */
#define LS_SPEC_EXACT_DRAFT_HEAD 1 /* draft with the model's own output head instead of the shortlist head */

/* One cycle's settings. */
typedef struct {
    int32_t draft_loops;        /* D, 1.. the session's loops (may exceed verify_loops) */
    int32_t verify_loops;       /* V, <= the session's loops; greedy output is plain decoding at V */
    int32_t draft_ahead;        /* k, 1..LS_SPEC_MAX_AHEAD */
    int32_t k_branches;         /* 1 = chain; K > 1 = tree (greedy only), K * k <= LS_SPEC_MAX_NODES */
    int32_t max_new;            /* >= 1: most tokens the cycle may return (drafting stops at max_new - 1) */
    int32_t flags;              /* LS_SPEC_* */
    float leaf_min_prob;        /* tree: a candidate becomes a leaf only when the draft gives it at
                                 * least this probability (0 = every top-K candidate), 0..1 */
    int32_t reserved;           /* 0 */
    ls_sampling sampling;       /* as ls_sample takes it */
} ls_spec_params;

/* One self-speculative cycle. The session holds positions [0, p) committed
 * in loops [0, verify_loops) (e.g. after ls_session_step of the prompt at
 * verify_loops loops, which returned `pending`); `pending` is the last
 * sampled token, not yet fed. The cycle drafts k = min(draft_ahead,
 * max_new - 1) tokens with draft_loops loops, verifies them in one batched
 * pass at verify_loops resuming from their loop-draft_loops states, and
 * writes the j + 1 new tokens (the accepted drafts, then the verifier's own
 * next token) to out_tokens (room for draft_ahead + 1). The caches then hold
 * p + j + 1 positions; the last new token is the next cycle's `pending`.
 * Greedy (temperature 0): the tokens are bit-identical to ls_session_step
 * decoding at verify_loops loops. draft_loops > verify_loops drafts with the
 * deeper model: the session needs draft_loops loops, whose caches beyond
 * verify_loops the first such cycle fills in for the positions already held
 * (one more pass over them). temperature > 0 (chain only): speculative
 * sampling, same output distribution as ls_session_step sampling.
 * k_branches > 1: tree of the greedy draft plus the k_branches - 1 next
 * draft candidates at each depth (those with at least leaf_min_prob draft
 * probability), verified in one masked pass; needs p + 1 + k_branches * k
 * <= max_seq (leaves take their own cache rows until the walk is done).
 * out_stats (nullable, 2 ints): tokens proposed, draft tokens accepted (j).
 * Returns j + 1, or LS_ERR_ARG (bad setting; a tree with temperature > 0
 * or with a cache mode other than LS_KV_FP16),
 * LS_ERR_STATE (caches not at the session's position), LS_ERR_FULL (no room
 * for the cycle's rows), LS_ERR_NOMEM, LS_ERR_UNSUPPORTED (a library
 * without LS_FEATURE_SPECULATIVE); on error nothing is committed. */
int32_t ls_spec_cycle(ls_session *s, int32_t pending, const ls_spec_params *params, int32_t *out_tokens,
                      int32_t *out_stats);

/* ls_spec_cycle, also handing back the verifier's distribution of every
 * returned token (for log-probabilities): ls_spec_cycle_masked without a
 * mask. logits_out: NULL, or room for
 * (draft_ahead + 1) * vocab_size floats; row i receives the logits at
 * verify_loops that out_tokens[i] was accepted or drawn against (the
 * position before it, on the accepted path), before any sampling
 * transform: bit-identical to the logits ls_session_step returns when
 * plain decoding reaches that position. Written only on success. */
int32_t ls_spec_cycle_logits(ls_session *s, int32_t pending, const ls_spec_params *params, int32_t *out_tokens,
                             int32_t *out_stats, float *logits_out);

/* The token mask after a path (structured output): writes into `mask` the
 * mask of the token that may follow the cycle's pending token and then the
 * n tokens of path, and returns 1; returns 0, mask unwritten, when no token
 * may follow that path (the format is complete there, or the path left it);
 * a negative LS_ERR_* fails the cycle with it. Called on the cycle's thread
 * (the caller's), never concurrently. */
typedef int32_t (*ls_mask_fn)(void *ctx, const int32_t *path, int32_t n, uint32_t *mask);

/* ls_spec_cycle_logits under token masks: every draft and every verifier
 * draw at a position is masked by mask_fn's mask for the path before it
 * (the drafts, and the verification of each row, in the chain and the
 * tree), and logits_out holds the masked logits, so greedy output is
 * bit-identical to masked ls_batch_step decoding at verify_loops and
 * sampled output has its distribution. mask_fn NULL: no mask. A draft
 * reaching a path no token may follow drafts on unmasked (its rows are
 * never accepted); when the verifier reaches such a path (after j >= 1
 * tokens; the pending token's own path must allow a token) the cycle ends
 * there: it returns those j tokens, the last the next pending one, with no
 * token of the verifier's own, and commits j positions. mask_fn is asked
 * only for paths the cycle needs. LS_ERR_UNSUPPORTED from a library without
 * LS_FEATURE_TOKEN_MASK when mask_fn is set. */
int32_t ls_spec_cycle_masked(ls_session *s, int32_t pending, const ls_spec_params *params, ls_mask_fn mask_fn,
                             void *mask_ctx, int32_t *out_tokens, int32_t *out_stats, float *logits_out);

/* ---- weight quantization (kernels/cpu/quantize.c, docs/model-format.md) ----
 *
 * What `loopserve model quantize` runs: one matrix at a time, rows of an
 * F32, F16 or BF16 matrix [rows, cols] into a format of "weight formats"
 * above (qweight, scales and, int2 only, zeros, laid out as the file holds
 * them). Each group's scale (int2: scale and offset) is searched among
 * fixed candidates for the least squared error; the procedure and its
 * arithmetic are written down in src/model/quantize.ts, the reference
 * quantizer, whose bytes these are: every SIMD path and thread count gives
 * the same output. */

/* The element type of the rows ls_quantize reads. */
typedef enum {
    LS_QUANTIZE_F32 = 0,
    LS_QUANTIZE_F16 = 1,
    LS_QUANTIZE_BF16 = 2,
} ls_quantize_input;

/* One matrix's format. */
typedef struct {
    int32_t bits;  /* 4 or 2 (a block matrix's int4 / int2), 8 or 6 (the head's int8 / int6); int4 heads are 4 */
    int32_t group; /* inputs per scale: a power of two in [LS_QUANT_GROUP_MIN, LS_QUANT_GROUP_MAX] dividing cols */
    int32_t cols;  /* inputs per row, 1..LS_MAX_FFN_DIM; with bits 6 a multiple of 64 */
    int32_t input; /* LS_QUANTIZE_*: src's element type */
} ls_quantize_params;

typedef struct ls_quantizer ls_quantizer;

/* A quantizer with its own pool of n_threads threads (<= 0: every online
 * core) and SIMD path (LS_SIMD_AUTO: the best the CPU has; a path it lacks
 * is refused). NULL with the reason in err on failure, or without
 * LS_FEATURE_QUANTIZE. */
ls_quantizer *ls_quantizer_new(int32_t n_threads, int32_t simd, char *err, int32_t err_len);
void ls_quantizer_free(ls_quantizer *q);

/* The LS_SIMD_* path q runs. */
int32_t ls_quantizer_simd(const ls_quantizer *q);

/* Quantizes `rows` rows of src (rows * cols elements of p->input) into
 * qweight (rows * cols * bits / 8 bytes), scales (rows * cols / group fp16)
 * and, bits 2 only, zeros (as many; NULL otherwise). Returns 0, or
 * LS_ERR_ARG for bad parameters or weights the format cannot hold (a
 * group's scale or offset beyond fp16: too large, infinite, or an int8
 * group holding a NaN), the reason in err; the outputs are then undefined. */
int32_t ls_quantize(ls_quantizer *q, const ls_quantize_params *p, const void *src, int32_t rows, uint8_t *qweight,
                    uint16_t *scales, uint16_t *zeros, char *err, int32_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* LOOPSERVE_H */
