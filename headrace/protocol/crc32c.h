/*
 * crc32c.h -- CRC-32C (Castagnoli), as Kafka's v2 record batches carry it, for every compiled
 * module that checks or seals a batch: static functions compiled into each includer.
 *
 * crc32c() runs one stream (SSE 4.2's crc32 instruction, or tables); crc32c_fast_update, the
 * one batch checks use, runs three interleaved hardware streams (the crc32 instruction has a
 * latency of three cycles and a throughput of one), combined with precomputed "shift through
 * N zero bytes" tables, about three times a single stream's speed; on CPUs with AVX-512
 * VPCLMULQDQ, buffers of 256 bytes or more are folded with carry-less multiplication instead,
 * about twice as fast again. The variant is chosen by crc32c_init() from the CPU's features,
 * capped by the environment variable HEADRACE_KERNEL_CRC32C (each extension reads it at its
 * init, so all of them choose alike).
 *
 * Layer: protocol (includes kernel_common.h only).
 *
 * Thread-safety: the tables and the function pointers are written once by crc32c_init(), at
 * module init; afterwards everything is read-only and reentrant, callable without the GIL.
 */
#ifndef HEADRACE_PROTOCOL_CRC32C_H
#define HEADRACE_PROTOCOL_CRC32C_H

/* Not every includer uses every function here. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "kernel_common.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

/* ------------------------------------------------------------------ CRC-32C */

static uint32_t crc32c_table[256];

static void crc32c_init_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t crc = i;
        for (int bit = 0; bit < 8; bit++)
            crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1)));
        crc32c_table[i] = crc;
    }
}

static uint32_t crc32c_portable(uint32_t crc, const uint8_t *p, size_t n)
{
    while (n--)
        crc = crc32c_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const uint8_t *p,
                                                                size_t n)
{
    uint64_t wide = crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        wide = __builtin_ia32_crc32di(wide, word);
    }
    crc = (uint32_t)wide;
    while (n--)
        crc = __builtin_ia32_crc32qi(crc, *p++);
    return crc;
}
#endif

static uint32_t (*crc32c_update)(uint32_t, const uint8_t *, size_t) = crc32c_portable;

static uint32_t crc32c(const uint8_t *p, size_t n) { return ~crc32c_update(~0u, p, n); }

#define CRC_LONG_STRIDE_BYTES 4096
#define CRC_SHORT_STRIDE_BYTES 256

static uint32_t crc32c_shift_long[4][256];
static uint32_t crc32c_shift_short[4][256];

/* table[k][v] = the raw CRC register after feeding `zero_bytes` zero bytes to a register
 * holding v << 8k: the operator is linear, so four lookups shift any register. */
static void crc32c_build_shift_table(uint32_t table[4][256], size_t zero_bytes)
{
    static const uint8_t zeros[CRC_LONG_STRIDE_BYTES];
    uint32_t basis[32];
    for (int bit = 0; bit < 32; bit++)
        basis[bit] = crc32c_update(1u << bit, zeros, zero_bytes);
    for (int byte = 0; byte < 4; byte++)
        for (uint32_t value = 0; value < 256; value++) {
            uint32_t shifted = 0;
            for (int bit = 0; bit < 8; bit++)
                if (value >> bit & 1)
                    shifted ^= basis[byte * 8 + bit];
            table[byte][value] = shifted;
        }
}

static uint32_t crc32c_shift(uint32_t table[4][256], uint32_t crc)
{
    return table[0][crc & 0xff] ^ table[1][crc >> 8 & 0xff] ^ table[2][crc >> 16 & 0xff] ^
           table[3][crc >> 24];
}

#if defined(__x86_64__) && defined(__GNUC__)
/* Raw CRC of 3 * stride bytes at p from register crc, as three interleaved streams. */
__attribute__((target("sse4.2"))) static uint32_t
crc32c_three_streams(uint32_t crc, const uint8_t *p, size_t stride, uint32_t table[4][256])
{
    uint64_t first = crc, second = 0, third = 0;
    for (size_t i = 0; i < stride; i += 8) {
        uint64_t a, b, c;
        memcpy(&a, p + i, 8);
        memcpy(&b, p + stride + i, 8);
        memcpy(&c, p + 2 * stride + i, 8);
        first = __builtin_ia32_crc32di(first, a);
        second = __builtin_ia32_crc32di(second, b);
        third = __builtin_ia32_crc32di(third, c);
    }
    uint32_t joined = crc32c_shift(table, (uint32_t)first) ^ (uint32_t)second;
    return crc32c_shift(table, joined) ^ (uint32_t)third;
}

static uint32_t crc32c_interleaved(uint32_t crc, const uint8_t *p, size_t n)
{
    for (; n >= 3 * CRC_LONG_STRIDE_BYTES; p += 3 * CRC_LONG_STRIDE_BYTES,
                                           n -= 3 * CRC_LONG_STRIDE_BYTES)
        crc = crc32c_three_streams(crc, p, CRC_LONG_STRIDE_BYTES, crc32c_shift_long);
    for (; n >= 3 * CRC_SHORT_STRIDE_BYTES; p += 3 * CRC_SHORT_STRIDE_BYTES,
                                            n -= 3 * CRC_SHORT_STRIDE_BYTES)
        crc = crc32c_three_streams(crc, p, CRC_SHORT_STRIDE_BYTES, crc32c_shift_short);
    return crc32c_sse42(crc, p, n);
}

/* Where the CPU has AVX-512 carry-less multiplication (VPCLMULQDQ), long buffers are folded
 * instead: four 512-bit accumulators each absorb 64 bytes per step by multiplying their 128-bit
 * lanes with x^(D-32) and x^(D+32) mod P (bit-reflected, D the fold distance in bits: the
 * scheme of zlib's folding CRC, for the Castagnoli polynomial), then collapse to one
 * 128-bit value whose 16 bytes, with the tail, go through the crc32 instruction. The initial
 * register is XORed into the first four bytes, as a reflected CRC allows. */
#define CRC_FOLD_MIN_BYTES 256 /* crc32c_folded_long needs four whole accumulators */
#define CRC32C_POLY_REFLECTED 0x82F63B78u

/* Fold constants {x^(D-32), x^(D+32)} mod P, reflected and shifted left by one: a lane's
 * high quadword is multiplied by the first, its low quadword by the second. */
static uint64_t crc_fold_256_bytes[2], crc_fold_64_bytes[2], crc_fold_48_bytes[2],
    crc_fold_32_bytes[2], crc_fold_16_bytes[2];

static uint64_t crc32c_x_power(unsigned exponent)
{
    uint32_t r = 0x80000000u; /* x^0, reflected */
    while (exponent--)
        r = r & 1 ? (r >> 1) ^ CRC32C_POLY_REFLECTED : r >> 1;
    return (uint64_t)r << 1;
}

static void crc_fold_constants(uint64_t k[2], unsigned distance_bytes)
{
    k[0] = crc32c_x_power(distance_bytes * 8 - 32);
    k[1] = crc32c_x_power(distance_bytes * 8 + 32);
}

#define CRC_FOLD_TARGET __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2")))

CRC_FOLD_TARGET static __m512i crc_fold_512(__m512i x, __m512i k, __m512i data)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x01),
                                     _mm512_clmulepi64_epi128(x, k, 0x10), data, 0x96);
}

CRC_FOLD_TARGET static __m128i crc_fold_128(__m128i x, const uint64_t k[2], __m128i data)
{
    __m128i constants = _mm_loadu_si128((const __m128i *)k);
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, constants, 0x01),
                                       _mm_clmulepi64_si128(x, constants, 0x10)),
                         data);
}

CRC_FOLD_TARGET static __m512i crc_fold_broadcast(const uint64_t k[2])
{
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)k));
}

/* Raw register after n >= 256 bytes at p, starting from register crc. */
CRC_FOLD_TARGET static uint32_t crc32c_folded_long(uint32_t crc, const uint8_t *p, size_t n)
{
    __m512i initial = _mm512_inserti32x4(_mm512_setzero_si512(),
                                         _mm_cvtsi32_si128((int)crc), 0);
    __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p), initial);
    __m512i x1 = _mm512_loadu_si512(p + 64), x2 = _mm512_loadu_si512(p + 128);
    __m512i x3 = _mm512_loadu_si512(p + 192);
    __m512i k = crc_fold_broadcast(crc_fold_256_bytes);
    for (p += 256, n -= 256; n >= 256; p += 256, n -= 256) {
        x0 = crc_fold_512(x0, k, _mm512_loadu_si512(p));
        x1 = crc_fold_512(x1, k, _mm512_loadu_si512(p + 64));
        x2 = crc_fold_512(x2, k, _mm512_loadu_si512(p + 128));
        x3 = crc_fold_512(x3, k, _mm512_loadu_si512(p + 192));
    }
    k = crc_fold_broadcast(crc_fold_64_bytes);
    x3 = crc_fold_512(crc_fold_512(crc_fold_512(x0, k, x1), k, x2), k, x3);
    for (; n >= 64; p += 64, n -= 64)
        x3 = crc_fold_512(x3, k, _mm512_loadu_si512(p));
    __m128i acc = _mm512_extracti32x4_epi32(x3, 3);
    acc = crc_fold_128(_mm512_extracti32x4_epi32(x3, 0), crc_fold_48_bytes, acc);
    acc = crc_fold_128(_mm512_extracti32x4_epi32(x3, 1), crc_fold_32_bytes, acc);
    acc = crc_fold_128(_mm512_extracti32x4_epi32(x3, 2), crc_fold_16_bytes, acc);
    uint64_t wide = __builtin_ia32_crc32di(0, (uint64_t)_mm_cvtsi128_si64(acc));
    wide = __builtin_ia32_crc32di(wide, (uint64_t)_mm_extract_epi64(acc, 1));
    return crc32c_sse42((uint32_t)wide, p, n);
}

static uint32_t crc32c_folded(uint32_t crc, const uint8_t *p, size_t n)
{
    if (n < CRC_FOLD_MIN_BYTES)
        return crc32c_interleaved(crc, p, n);
    return crc32c_folded_long(crc, p, n);
}

static int crc32c_fold_supported(void)
{
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("vpclmulqdq") ||
        !__builtin_cpu_supports("pclmul"))
        return 0;
    crc_fold_constants(crc_fold_256_bytes, 256);
    crc_fold_constants(crc_fold_64_bytes, 64);
    crc_fold_constants(crc_fold_48_bytes, 48);
    crc_fold_constants(crc_fold_32_bytes, 32);
    crc_fold_constants(crc_fold_16_bytes, 16);
    return 1;
}
#endif

static uint32_t (*crc32c_fast_update)(uint32_t, const uint8_t *, size_t) = crc32c_portable;
static const char *crc32c_variant = "portable";
/* The variants this CPU can run, fastest last, whatever the environment caps. */
static const char *crc32c_variants_supported = "portable";

/* Environment variable that caps the CRC-32C variant: "portable" (table lookups), "interleaved"
 * (three SSE 4.2 streams) or unset/"auto" (the fastest the CPU has). A variant the CPU lacks
 * falls back to the next slower one. For diagnosing a CPU-specific fault and for testing every
 * variant on one machine. */
#define CRC32C_VARIANT_ENV "HEADRACE_KERNEL_CRC32C"

static void crc32c_variant_init(void)
{
    const char *cap = getenv(CRC32C_VARIANT_ENV);
#if defined(__x86_64__) && defined(__GNUC__)
    if (crc32c_update == crc32c_sse42)
        crc32c_variants_supported = crc32c_fold_supported() ? "portable interleaved folded"
                                                            : "portable interleaved";
#endif
    if (cap != NULL && strcmp(cap, "portable") == 0) {
        crc32c_update = crc32c_portable;
        crc32c_fast_update = crc32c_portable;
        return;
    }
#if defined(__x86_64__) && defined(__GNUC__)
    if (crc32c_update == crc32c_sse42) {
        crc32c_build_shift_table(crc32c_shift_long, CRC_LONG_STRIDE_BYTES);
        crc32c_build_shift_table(crc32c_shift_short, CRC_SHORT_STRIDE_BYTES);
        int interleaved_only = cap != NULL && strcmp(cap, "interleaved") == 0;
        if (!interleaved_only && crc32c_fold_supported()) {
            crc32c_fast_update = crc32c_folded;
            crc32c_variant = "folded";
        } else {
            crc32c_fast_update = crc32c_interleaved;
            crc32c_variant = "interleaved";
        }
        return;
    }
#endif
    crc32c_fast_update = crc32c_update;
}


/* Module init: the table, the single-stream variant the CPU has, then the fast variant. */
static void crc32c_init(void)
{
    crc32c_init_table();
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2"))
        crc32c_update = crc32c_sse42;
#endif
    crc32c_variant_init();
}

/* Export the choice on an extension module: CRC32C_VARIANT and CRC32C_VARIANTS_SUPPORTED (the
 * variants this CPU can run, slowest first). 0, or -1 with an exception set. */
static int crc32c_add_variant_constants(PyObject *module)
{
    if (PyModule_AddStringConstant(module, "CRC32C_VARIANT", crc32c_variant) < 0 ||
        PyModule_AddStringConstant(module, "CRC32C_VARIANTS_SUPPORTED",
                                   crc32c_variants_supported) < 0)
        return -1;
    return 0;
}

#pragma GCC diagnostic pop

#endif /* HEADRACE_PROTOCOL_CRC32C_H */
