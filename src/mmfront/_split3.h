/* 3-byte pixels split into 3 planes, shared by mmfront's C extensions (the patch rows of
   mmfront._pixels, the resize of mmfront._bicubic): a portable loop and an SSSE3 one, picked once
   at import by best_split3(). Include after <stdint.h>, <stddef.h> and, on x86, <immintrin.h>
   with MMFRONT_X86_SIMD defined. */

#ifndef MMFRONT_SPLIT3_H
#define MMFRONT_SPLIT3_H

typedef void (*split_fn)(uint8_t *r, uint8_t *g, uint8_t *b, const uint8_t *src, size_t pixels);

static void
split3_portable(uint8_t *r, uint8_t *g, uint8_t *b, const uint8_t *src, size_t pixels)
{
    for (size_t i = 0; i < pixels; i++) {
        r[i] = src[3 * i];
        g[i] = src[3 * i + 1];
        b[i] = src[3 * i + 2];
    }
}

#ifdef MMFRONT_X86_SIMD

/* 16 pixels (three 16-byte loads) per step: each plane's 16 bytes gathered from the three loads
   by one byte shuffle each and merged with OR (a -1 index yields 0). */
__attribute__((target("ssse3"))) static void
split3_ssse3(uint8_t *r, uint8_t *g, uint8_t *b, const uint8_t *src, size_t pixels)
{
    const __m128i r0 = _mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i r1 = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1);
    const __m128i r2 = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13);
    const __m128i g0 = _mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i g1 = _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1);
    const __m128i g2 = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14);
    const __m128i b0 = _mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i b1 = _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1);
    const __m128i b2 = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15);
    size_t i = 0;
    for (; i + 16 <= pixels; i += 16) {
        const uint8_t *at = src + 3 * i;
        __m128i v0 = _mm_loadu_si128((const __m128i *)at);
        __m128i v1 = _mm_loadu_si128((const __m128i *)(at + 16));
        __m128i v2 = _mm_loadu_si128((const __m128i *)(at + 32));
        _mm_storeu_si128((__m128i *)(r + i), _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(v0, r0), _mm_shuffle_epi8(v1, r1)),
                                                          _mm_shuffle_epi8(v2, r2)));
        _mm_storeu_si128((__m128i *)(g + i), _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(v0, g0), _mm_shuffle_epi8(v1, g1)),
                                                          _mm_shuffle_epi8(v2, g2)));
        _mm_storeu_si128((__m128i *)(b + i), _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(v0, b0), _mm_shuffle_epi8(v1, b1)),
                                                          _mm_shuffle_epi8(v2, b2)));
    }
    split3_portable(r + i, g + i, b + i, src + 3 * i, pixels - i);
}

static split_fn
best_split3(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("ssse3") ? split3_ssse3 : split3_portable;
}

#else

static split_fn
best_split3(void)
{
    return split3_portable;
}

#endif

#endif
