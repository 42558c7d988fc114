/*
 * util.c — error text, fp16 <-> fp32 conversion, version, status and SIMD names.
 *
 * The conversions here are the portable reference every SIMD path must
 * agree with bit for bit (F16C's vcvtph2ps/vcvtps2ph with round-to-nearest-
 * even produce the same results), so they are exact rather than fast.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

// ---- errors ----

void ls_set_error(char *err, int32_t err_len, const char *fmt, ...) {
    if (err == NULL || err_len <= 0) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err, (size_t)err_len, fmt, ap);
    va_end(ap);
    // vsnprintf leaves the buffer unspecified on an encoding error.
    if (n < 0) err[0] = '\0';
    err[err_len - 1] = '\0';
}

// ---- fp16 <-> fp32 ----

float ls_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {
            // Subnormal: mant * 2^-24 is exact in fp32 (at most 10 significant bits).
            float f = (float)mant * 5.9604644775390625e-8f;
            memcpy(&bits, &f, sizeof bits);
            bits |= sign;
        }
    } else if (exp == 31) {
        // Inf keeps mant == 0; a NaN keeps its payload and comes out quiet, as
        // F16C's vcvtph2ps makes it, so every path yields the same bits.
        bits = sign | 0x7f800000u | (mant << 13);
        if (mant != 0) bits |= 0x400000u;
    } else {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

uint16_t ls_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;

    if (ax >= 0x7f800000u) {
        if (ax == 0x7f800000u) return (uint16_t)(sign | 0x7c00u);
        // Quiet the NaN so that dropping low payload bits can never turn it into inf.
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    }
    // 65520 = 65504 + half an ulp: from here on round-to-nearest-even gives inf.
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);

    if (ax >= 0x38800000u) {
        // Normal result: rebias the exponent (127 -> 15) and round the 13 dropped
        // bits to nearest even; a carry out of the mantissa correctly bumps the
        // exponent, and the check above keeps it below the inf encoding.
        uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }

    // Subnormal (or zero) result: value = m * 2^-24 with m in [0, 1024].
    uint32_t e = ax >> 23;
    if (e < 102) return sign; // below 2^-25: rounds to zero
    uint32_t full = (ax & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; // 14..24
    uint32_t q = full >> shift;
    uint32_t rem = full & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (q & 1u))) q++; // q == 1024 is the smallest normal
    return (uint16_t)(sign | q);
}

// ---- version and names ----

int32_t ls_abi_version(void) { return LS_ABI_VERSION; }

const char *ls_status_str(int32_t status) {
    switch (status) {
    case LS_OK: return "ok";
    case LS_ERR_ARG: return "invalid argument";
    case LS_ERR_FULL: return "session is full";
    case LS_ERR_NOMEM: return "out of memory";
    case LS_ERR_STATE: return "invalid session state";
    case LS_ERR_UNSUPPORTED: return "not supported by this kernel library";
    default: return "unknown status";
    }
}

const char *ls_simd_name(int32_t simd) {
    switch (simd) {
    case LS_SIMD_AUTO: return "auto";
    case LS_SIMD_PORTABLE: return "portable";
    case LS_SIMD_AVX2: return "avx2";
    case LS_SIMD_AVX512: return "avx512";
    default: return "unknown";
    }
}
