/* mmfront._bicubic: torch's uint8 antialiased bicubic resize (F.interpolate(mode="bicubic",
   antialias=True) of a uint8 image, what HF's torchvision image processors run), bit for bit, from
   channels-last RGB pixels into RGB planes, as Qwen2-VL's patch rows read them.

torch computes it in integers: per axis, int16 weights at one precision (mmfront.bicubic makes
them exactly as torch does), a horizontal pass into uint8 rows, then a vertical pass; each output
is (sum of weight x pixel + half) >> precision, clamped to 0..255. Any loop that sums the same
integers gives the same bytes, so this one is free to go its own way: the horizontal pass works on
planes, 8 outputs at a time whose taps all lie in one 16-byte window (one byte shuffle and two
multiply-adds per pair of taps, two such halves per AVX2 step; at Qwen's scales, within ~1.3x of
the source size, every window fits), and the vertical pass, 32 outputs a step, keeps only the
rows it still needs, in a ring. torch's own kernel
packs the pixels to 4 bytes, filters each one's channels together and lays the result out
channels-last; patch rows want planes.

Everything that comes from Python is checked; a bad argument raises TypeError or ValueError. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define MMFRONT_X86_SIMD 1
#include <immintrin.h>
#endif

#include "_index_arg.h"
#include "_split3.h"

#define WINDOW 16 /* bytes one horizontal block reads */
#define BLOCK 16  /* outputs per horizontal block: two halves of 8, one per 128-bit lane */
#define PAD 32    /* slack after every row, so that a window past the end is memory */

/* One axis: each output's first source index and its taps' int16 weights (zero past its own). */
typedef struct {
    const int32_t *first;
    const int16_t *weights;
    size_t taps;
    int precision;
} Axis;

/* The horizontal blocks of one axis, BLOCK outputs each in two halves of 8, one per 128-bit
   lane: where each half reads its 16-byte window, and for each pair of taps the two byte shuffles
   that gather each output's pair of pixels as 16-bit words (outputs 0-3 of a half, then 4-7) and
   the pairs' weights, laid out as the lanes want them. */
typedef struct {
    size_t count; /* whole blocks */
    size_t pairs;
    int32_t *start;  /* [count][2]; the first -1 when a half's taps do not fit its window */
    uint8_t *masks;  /* [count][pairs][2: outputs 0-3, 4-7 of each half][2 halves][16] */
    int16_t *paired; /* [count][pairs][4 quarters: outputs 0-3 of each half, then 4-7][8] */
} Blocks;

static inline uint8_t
clamp_u8(int32_t value)
{
    return value < 0 ? 0 : value > 255 ? 255 : (uint8_t)value;
}

static inline int32_t
half_of(int precision)
{
    return precision > 0 ? (int32_t)1 << (precision - 1) : 0;
}

/* Outputs [from, to) of one plane's line, one at a time. */
static void
horizontal_portable(uint8_t *out, const uint8_t *in, const Axis *axis, size_t from, size_t to)
{
    int32_t half = half_of(axis->precision);
    for (size_t x = from; x < to; x++) {
        const uint8_t *pixels = in + axis->first[x];
        const int16_t *weights = axis->weights + x * axis->taps;
        int32_t sum = half;
        for (size_t k = 0; k < axis->taps; k++) {
            sum += (int32_t)weights[k] * pixels[k];
        }
        out[x] = clamp_u8(sum >> axis->precision);
    }
}

/* Outputs [from, width) of one plane's row from its taps' rows, one at a time. */
static void
vertical_portable(uint8_t *out, uint8_t *const *rows, const int16_t *weights, size_t taps, int precision, size_t from,
                  size_t width)
{
    int32_t half = half_of(precision);
    for (size_t x = from; x < width; x++) {
        int32_t sum = half;
        for (size_t k = 0; k < taps; k++) {
            sum += (int32_t)weights[k] * rows[k][x];
        }
        out[x] = clamp_u8(sum >> precision);
    }
}

static int
blocks_make(Blocks *blocks, const Axis *axis, size_t width)
{
    blocks->count = width / BLOCK;
    blocks->pairs = (axis->taps + 1) / 2;
    size_t n = blocks->count ? blocks->count : 1;
    blocks->start = malloc(n * 2 * sizeof(int32_t));
    blocks->masks = malloc(n * blocks->pairs * 64);
    blocks->paired = malloc(n * blocks->pairs * 32 * sizeof(int16_t));
    if (blocks->start == NULL || blocks->masks == NULL || blocks->paired == NULL) {
        return -1;
    }
    for (size_t b = 0; b < blocks->count; b++) {
        int fits = 1;
        for (size_t half = 0; half < 2; half++) {
            size_t x0 = b * BLOCK + half * 8;
            int32_t start = axis->first[x0];
            blocks->start[2 * b + half] = start;
            for (size_t p = 0; p < blocks->pairs; p++) {
                int16_t *paired = blocks->paired + (b * blocks->pairs + p) * 32;
                for (size_t j = 0; j < 8; j++) {
                    /* outputs 0-3 of a half go to quarter `half`, 4-7 to quarter 2 + `half` */
                    size_t quarter = (j / 4) * 2 + half;
                    uint8_t *mask = blocks->masks + (b * blocks->pairs + p) * 64 + quarter * 16 + (j % 4) * 4;
                    for (size_t e = 0; e < 2; e++) {
                        size_t k = 2 * p + e;
                        int16_t weight = k < axis->taps ? axis->weights[(x0 + j) * axis->taps + k] : 0;
                        int32_t at = axis->first[x0 + j] + (int32_t)k - start;
                        paired[quarter * 8 + (j % 4) * 2 + e] = weight;
                        mask[2 * e + 1] = 0x80; /* the high byte of each 16-bit word */
                        if (weight == 0) {
                            mask[2 * e] = 0x80; /* a zero: the tap adds nothing either way */
                        } else if (at < 0 || at >= WINDOW) {
                            fits = 0;
                        } else {
                            mask[2 * e] = (uint8_t)at;
                        }
                    }
                }
            }
        }
        if (!fits) {
            blocks->start[2 * b] = -1;
        }
    }
    return 0;
}

static void
blocks_free(Blocks *blocks)
{
    free(blocks->start);
    free(blocks->masks);
    free(blocks->paired);
}

#ifdef MMFRONT_X86_SIMD

/* The three planes' lines, BLOCK outputs of each per step: per pair of taps, two shuffles gather
   the pairs of pixels from each half's window as words and two multiply-adds sum them with their
   weights. */
__attribute__((target("avx2"))) static void
horizontal_avx2(uint8_t *const *out, const uint8_t *const *in, const Axis *axis, const Blocks *blocks, size_t width)
{
    const __m256i half = _mm256_set1_epi32(half_of(axis->precision));
    for (size_t b = 0; b < blocks->count; b++) {
        size_t x0 = b * BLOCK;
        if (blocks->start[2 * b] < 0) {
            for (size_t c = 0; c < 3; c++) {
                horizontal_portable(out[c], in[c], axis, x0, x0 + BLOCK);
            }
            continue;
        }
        __m256i window[3], low[3], high[3];
        for (size_t c = 0; c < 3; c++) {
            window[c] = _mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(in[c] + blocks->start[2 * b]))),
                _mm_loadu_si128((const __m128i *)(in[c] + blocks->start[2 * b + 1])), 1);
            low[c] = high[c] = half;
        }
        const __m256i *masks = (const __m256i *)(blocks->masks + b * blocks->pairs * 64);
        const __m256i *paired = (const __m256i *)(blocks->paired + b * blocks->pairs * 32);
        for (size_t p = 0; p < blocks->pairs; p++) {
            __m256i m_low = _mm256_loadu_si256(masks + 2 * p), m_high = _mm256_loadu_si256(masks + 2 * p + 1);
            __m256i w_low = _mm256_loadu_si256(paired + 2 * p), w_high = _mm256_loadu_si256(paired + 2 * p + 1);
            for (size_t c = 0; c < 3; c++) {
                low[c] = _mm256_add_epi32(low[c], _mm256_madd_epi16(_mm256_shuffle_epi8(window[c], m_low), w_low));
                high[c] = _mm256_add_epi32(high[c], _mm256_madd_epi16(_mm256_shuffle_epi8(window[c], m_high), w_high));
            }
        }
        for (size_t c = 0; c < 3; c++) {
            __m256i words = _mm256_packs_epi32(_mm256_srai_epi32(low[c], axis->precision),
                                               _mm256_srai_epi32(high[c], axis->precision));
            __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(words, words), 0x08);
            _mm_storeu_si128((__m128i *)(out[c] + x0), _mm256_castsi256_si128(bytes));
        }
    }
    for (size_t c = 0; c < 3; c++) {
        horizontal_portable(out[c], in[c], axis, blocks->count * BLOCK, width);
    }
}

/* One plane's row, 32 outputs per step: each pair of rows' bytes interleaved, widened and
   multiply-added with the pair's weights. */
__attribute__((target("avx2"))) static void
vertical_avx2(uint8_t *out, uint8_t *const *rows, const int16_t *weights, size_t taps, int precision, size_t width)
{
    const __m256i half = _mm256_set1_epi32(half_of(precision));
    const __m256i zero = _mm256_setzero_si256();
    __m256i pairs[32];
    for (size_t k = 0; k < taps; k += 2) {
        uint32_t pair = (uint16_t)weights[k] | (k + 1 < taps ? (uint32_t)(uint16_t)weights[k + 1] << 16 : 0);
        pairs[k / 2] = _mm256_set1_epi32((int32_t)pair);
    }
    size_t x = 0;
    for (; x + 32 <= width; x += 32) {
        __m256i sum[4] = {half, half, half, half};
        for (size_t k = 0; k < taps; k += 2) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(rows[k] + x));
            __m256i b = k + 1 < taps ? _mm256_loadu_si256((const __m256i *)(rows[k + 1] + x)) : zero;
            __m256i low = _mm256_unpacklo_epi8(a, b), high = _mm256_unpackhi_epi8(a, b);
            sum[0] = _mm256_add_epi32(sum[0], _mm256_madd_epi16(_mm256_unpacklo_epi8(low, zero), pairs[k / 2]));
            sum[1] = _mm256_add_epi32(sum[1], _mm256_madd_epi16(_mm256_unpackhi_epi8(low, zero), pairs[k / 2]));
            sum[2] = _mm256_add_epi32(sum[2], _mm256_madd_epi16(_mm256_unpacklo_epi8(high, zero), pairs[k / 2]));
            sum[3] = _mm256_add_epi32(sum[3], _mm256_madd_epi16(_mm256_unpackhi_epi8(high, zero), pairs[k / 2]));
        }
        __m256i words_low = _mm256_packs_epi32(_mm256_srai_epi32(sum[0], precision), _mm256_srai_epi32(sum[1], precision));
        __m256i words_high = _mm256_packs_epi32(_mm256_srai_epi32(sum[2], precision), _mm256_srai_epi32(sum[3], precision));
        _mm256_storeu_si256((__m256i *)(out + x), _mm256_packus_epi16(words_low, words_high));
    }
    vertical_portable(out, rows, weights, taps, precision, x, width);
}

static int
have_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2");
}

#else

static int
have_avx2(void)
{
    return 0;
}

#endif

/* Chosen once at import; a test may turn the SIMD loops off (loops(False)) to compare the two. */
static split_fn split3 = split3_portable;
static int simd = 0;

static void
horizontal(uint8_t *const *out, const uint8_t *const *in, const Axis *axis, const Blocks *blocks, size_t width)
{
#ifdef MMFRONT_X86_SIMD
    if (simd) {
        horizontal_avx2(out, in, axis, blocks, width);
        return;
    }
#endif
    (void)blocks;
    for (size_t c = 0; c < 3; c++) {
        horizontal_portable(out[c], in[c], axis, 0, width);
    }
}

static void
vertical(uint8_t *out, uint8_t *const *rows, const int16_t *weights, size_t taps, int precision, size_t width)
{
#ifdef MMFRONT_X86_SIMD
    if (simd) {
        vertical_avx2(out, rows, weights, taps, precision, width);
        return;
    }
#endif
    vertical_portable(out, rows, weights, taps, precision, 0, width);
}

/* The resize; `h` or `v` NULL where that axis keeps its size (torch skips the pass). -1 when
   scratch memory cannot be had. */
static int
resize_rgb(uint8_t *dst, const uint8_t *src, size_t height, size_t width, size_t out_height, size_t out_width,
           const Axis *h, const Axis *v)
{
    /* a source line also has room for the last output's taps past the end (their weights are 0) */
    size_t in_line = width + (h != NULL ? h->taps : 0) + PAD, out_line = out_width + PAD;
    size_t ring = v != NULL ? v->taps : 1;
    uint8_t *split = malloc(3 * in_line);
    uint8_t *rows = malloc(3 * ring * out_line);
    Blocks blocks = {0};
    int ok = split != NULL && rows != NULL && (h == NULL || blocks_make(&blocks, h, out_width) == 0);
    if (ok) {
        memset(split, 0, 3 * in_line);
        memset(rows, 0, 3 * ring * out_line);
        size_t next = 0; /* the next source row to filter horizontally */
        for (size_t y = 0; y < out_height; y++) {
            size_t first = v != NULL ? (size_t)v->first[y] : y;
            size_t need = first + ring < height ? first + ring : height;
            for (; next < need; next++) {
                uint8_t *slot[3];
                for (size_t c = 0; c < 3; c++) {
                    slot[c] = rows + (c * ring + next % ring) * out_line;
                }
                const uint8_t *line = src + next * width * 3;
                if (h == NULL) {
                    split3(slot[0], slot[1], slot[2], line, width);
                    continue;
                }
                const uint8_t *planes[3] = {split, split + in_line, split + 2 * in_line};
                split3(split, split + in_line, split + 2 * in_line, line, width);
                horizontal(slot, planes, h, &blocks, out_width);
            }
            for (size_t c = 0; c < 3; c++) {
                uint8_t *out = dst + (c * out_height + y) * out_width;
                if (v == NULL) {
                    memcpy(out, rows + (c * ring + y % ring) * out_line, out_width);
                    continue;
                }
                uint8_t *taps[64];
                for (size_t k = 0; k < v->taps; k++) {
                    taps[k] = rows + (c * ring + (first + k) % ring) * out_line;
                }
                vertical(out, taps, v->weights + y * v->taps, v->taps, v->precision, out_width);
            }
        }
    }
    if (h != NULL) {
        blocks_free(&blocks);
    }
    free(split);
    free(rows);
    return ok ? 0 : -1;
}

/* --- the Python entry ------------------------------------------------------------------------ */

/* A size: an int from 1 to 2**20. */
static int
size_arg(PyObject *arg, const char *name, size_t *value)
{
    Py_ssize_t v;
    if (index_arg(arg, name, &v) < 0) {
        return -1;
    }
    if (v < 1 || v > (1 << 20)) {
        PyErr_Format(PyExc_ValueError, "%s must be 1 to %d, not %zd", name, 1 << 20, v);
        return -1;
    }
    *value = (size_t)v;
    return 0;
}

/* An axis from (first, weights, precision) buffers, checked against the sizes; views released by
   the caller. Sets *present to 0 for None (the axis keeps its size). */
static int
axis_arg(PyObject *first_arg, PyObject *weights_arg, PyObject *precision_arg, size_t in_size, size_t out_size,
         const char *name, Axis *axis, Py_buffer *first, Py_buffer *weights, int *present)
{
    *present = 0;
    if (first_arg == Py_None) {
        if (in_size != out_size) {
            PyErr_Format(PyExc_ValueError, "the %s axis changes size (%zu -> %zu) but has no weights", name, in_size,
                         out_size);
            return -1;
        }
        return 0;
    }
    long precision = PyLong_Check(precision_arg) ? PyLong_AsLong(precision_arg) : -1;
    if (precision < 1 || precision > 22) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_ValueError, "the %s precision must be an int from 1 to 22", name);
        }
        return -1;
    }
    if (PyObject_GetBuffer(first_arg, first, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    if (PyObject_GetBuffer(weights_arg, weights, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(first);
        return -1;
    }
    *present = 1;
    if (first->itemsize != 4 || (size_t)first->len != 4 * out_size || weights->itemsize != 2 || weights->len <= 0
        || (size_t)weights->len % (2 * out_size) != 0) {
        PyErr_Format(PyExc_ValueError, "the %s axis needs %zu int32 first indices and %zu x taps int16 weights", name,
                     out_size, out_size);
        return -1;
    }
    axis->first = first->buf;
    axis->weights = weights->buf;
    axis->taps = (size_t)weights->len / 2 / out_size;
    axis->precision = (int)precision;
    if (axis->taps > 64) {
        PyErr_Format(PyExc_ValueError, "the %s axis has %zu taps; at most 64", name, axis->taps);
        return -1;
    }
    for (size_t i = 0; i < out_size; i++) {
        if (axis->first[i] < 0 || (size_t)axis->first[i] >= in_size || (i > 0 && axis->first[i] < axis->first[i - 1])) {
            PyErr_Format(PyExc_ValueError, "the %s axis's first indices must rise within 0..%zu", name, in_size - 1);
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(resize_doc,
"resize(src, dst, height, width, out_height, out_width, h_first, h_weights, h_precision, v_first, v_weights,\n"
"       v_precision, /) -> None\n"
"\n"
"torch's uint8 antialiased bicubic resize of height x width channels-last RGB pixels (src,\n"
"C-contiguous) into 3 planes of out_height x out_width (dst). Each axis comes as its outputs'\n"
"first source indices (int32), their int16 weights (out x taps, zero past each output's own) and\n"
"the weights' precision, as mmfront.bicubic.axis_weights makes them; None for an axis that keeps\n"
"its size. Runs without the GIL.");

static PyObject *
resize(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 12) {
        PyErr_Format(PyExc_TypeError, "resize() takes 12 positional arguments (%zd given)", nargs);
        return NULL;
    }
    size_t height, width, out_height, out_width;
    if (size_arg(args[2], "height", &height) < 0 || size_arg(args[3], "width", &width) < 0
        || size_arg(args[4], "out_height", &out_height) < 0 || size_arg(args[5], "out_width", &out_width) < 0) {
        return NULL;
    }
    Py_buffer in = {0}, out = {0}, h_first = {0}, h_weights = {0}, v_first = {0}, v_weights = {0};
    int have_in = 0, have_out = 0, have_h = 0, have_v = 0;
    Axis h, v;
    PyObject *result = NULL;
    if (PyObject_GetBuffer(args[0], &in, PyBUF_C_CONTIGUOUS) < 0) {
        goto done;
    }
    have_in = 1;
    if (PyObject_GetBuffer(args[1], &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        goto done;
    }
    have_out = 1;
    if (axis_arg(args[6], args[7], args[8], width, out_width, "horizontal", &h, &h_first, &h_weights, &have_h) < 0
        || axis_arg(args[9], args[10], args[11], height, out_height, "vertical", &v, &v_first, &v_weights, &have_v) < 0) {
        goto done;
    }
    if ((size_t)in.len != height * width * 3) {
        PyErr_Format(PyExc_ValueError, "src holds %zd bytes, not %zu x %zu x 3", in.len, height, width);
        goto done;
    }
    if ((size_t)out.len != out_height * out_width * 3) {
        PyErr_Format(PyExc_ValueError, "dst holds %zd bytes, not 3 x %zu x %zu", out.len, out_height, out_width);
        goto done;
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = resize_rgb(out.buf, in.buf, height, width, out_height, out_width, have_h ? &h : NULL, have_v ? &v : NULL);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    if (have_v) {
        PyBuffer_Release(&v_first);
        PyBuffer_Release(&v_weights);
    }
    if (have_h) {
        PyBuffer_Release(&h_first);
        PyBuffer_Release(&h_weights);
    }
    if (have_out) {
        PyBuffer_Release(&out);
    }
    if (have_in) {
        PyBuffer_Release(&in);
    }
    return result;
}

PyDoc_STRVAR(loops_doc,
"loops(simd=None, /) -> str\n"
"\n"
"The loops in use (\"avx2\" or \"portable\"); with simd False or True, first switch to the\n"
"portable loops or back to the best this machine has (for tests that compare the two).");

static PyObject *
loops(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "loops() takes at most 1 argument");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        int want = PyObject_IsTrue(args[0]);
        if (want < 0) {
            return NULL;
        }
        simd = want && have_avx2();
        split3 = simd ? best_split3() : split3_portable;
    }
    return PyUnicode_FromString(simd ? "avx2" : "portable");
}

static PyMethodDef bicubic_methods[] = {
    {"resize", (PyCFunction)(void (*)(void))resize, METH_FASTCALL, resize_doc},
    {"loops", (PyCFunction)(void (*)(void))loops, METH_FASTCALL, loops_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef bicubic_module = {
    PyModuleDef_HEAD_INIT,
    "mmfront._bicubic",
    "torch's uint8 antialiased bicubic resize into planes (optional; mmfront.bicubic falls back to torch).",
    -1,
    bicubic_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__bicubic(void)
{
    simd = have_avx2();
    split3 = simd ? best_split3() : split3_portable;
    return PyModule_Create(&bicubic_module);
}
