/* mmfront._pixels: pack a PIL image's 4-byte pixels into the bytes numpy's array of it holds;
   turn resized uint8 planes or channels-last pixels into normalized model-dtype planes through a
   table (lut_planes, lut_interleaved); and
   lay resized planes out as Qwen2-VL's patch rows in one pass (patchify).

Pillow stores an RGB pixel in 4 bytes (RGBX), while np.asarray(image) -- which vLLM hashes --
holds 3. Pillow's own packer does the conversion holding the GIL, so it can neither overlap the
hashing nor run beside other threads. This module reads Pillow's pixel memory through the Arrow
C data interface (Image.__arrow_c_array__, Pillow >= 11.2: a zero-copy, reference-counted export)
and packs any byte range of numpy's array into a caller's buffer with the GIL released.

Everything that comes from Python is checked; anything unexpected raises TypeError or
ValueError, and the caller falls back to Pillow's packer. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define MMFRONT_X86_SIMD 1
#include <immintrin.h>
#endif

/* The Arrow C data interface structs (https://arrow.apache.org/docs/format/CDataInterface.html),
   a stable ABI that every producer and consumer declares itself. */
struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

typedef void (*pack_fn)(uint8_t *dst, const uint8_t *src, size_t pixels);

/* --- kernels: the first 3 of every 4 bytes --------------------------------------------------- */

static void
pack3_portable(uint8_t *dst, const uint8_t *src, size_t pixels)
{
    for (size_t i = 0; i < pixels; i++) {
        dst[3 * i] = src[4 * i];
        dst[3 * i + 1] = src[4 * i + 1];
        dst[3 * i + 2] = src[4 * i + 2];
    }
}

#ifdef MMFRONT_X86_SIMD

/* 8 pixels per step: compact each 128-bit lane's 4 pixels into its low 12 bytes, move the two
   12-byte runs together, store 32 bytes of which the last 8 are rewritten by the next step. The
   loop stops while a full 32-byte store still fits; the rest goes through the portable loop. */
__attribute__((target("avx2"))) static void
pack3_avx2(uint8_t *dst, const uint8_t *src, size_t pixels)
{
    const __m256i compact = _mm256_setr_epi8(
        0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
        0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    const __m256i join = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7);
    size_t i = 0;
    for (; i + 11 <= pixels; i += 8) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(src + 4 * i));
        v = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, compact), join);
        _mm256_storeu_si256((__m256i *)(dst + 3 * i), v);
    }
    pack3_portable(dst + 3 * i, src + 4 * i, pixels - i);
}

/* The same with 16-byte vectors: 4 pixels per step, 16-byte stores overlapping by 4. */
__attribute__((target("ssse3"))) static void
pack3_ssse3(uint8_t *dst, const uint8_t *src, size_t pixels)
{
    const __m128i compact = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1);
    size_t i = 0;
    for (; i + 6 <= pixels; i += 4) {
        __m128i v = _mm_loadu_si128((const __m128i *)(src + 4 * i));
        _mm_storeu_si128((__m128i *)(dst + 3 * i), _mm_shuffle_epi8(v, compact));
    }
    pack3_portable(dst + 3 * i, src + 4 * i, pixels - i);
}

static int
kernel_supported(pack_fn fn)
{
    __builtin_cpu_init();
    if (fn == pack3_avx2) {
        return __builtin_cpu_supports("avx2");
    }
    if (fn == pack3_ssse3) {
        return __builtin_cpu_supports("ssse3");
    }
    return 1;
}

static pack_fn
best_pack3(void)
{
    if (kernel_supported(pack3_avx2)) {
        return pack3_avx2;
    }
    if (kernel_supported(pack3_ssse3)) {
        return pack3_ssse3;
    }
    return pack3_portable;
}

#else

static int
kernel_supported(pack_fn fn)
{
    (void)fn;
    return 1;
}

static pack_fn
best_pack3(void)
{
    return pack3_portable;
}

#endif

#include "_index_arg.h"
#include "_split3.h"

/* The split in use, chosen once at import. */
static split_fn split3 = split3_portable;

/* The loop in use; only ever read or written with the GIL held. */
static pack_fn pack3 = pack3_portable;

/* --- the Arrow export ------------------------------------------------------------------------ */

/* Pillow's 4-byte pixels, when `schema`/`array` are the capsules of a single-block export:
   a fixed-size list of 4 uint8 per pixel, no nulls, no offsets. */
static int
arrow_pixels(PyObject *schema_capsule, PyObject *array_capsule, const uint8_t **data, int64_t *count)
{
    if (!PyCapsule_IsValid(schema_capsule, "arrow_schema")) {
        PyErr_SetString(PyExc_TypeError, "schema must be an 'arrow_schema' capsule (Image.__arrow_c_array__()[0])");
        return -1;
    }
    if (!PyCapsule_IsValid(array_capsule, "arrow_array")) {
        PyErr_SetString(PyExc_TypeError, "array must be an 'arrow_array' capsule (Image.__arrow_c_array__()[1])");
        return -1;
    }
    const struct ArrowSchema *schema = PyCapsule_GetPointer(schema_capsule, "arrow_schema");
    const struct ArrowArray *array = PyCapsule_GetPointer(array_capsule, "arrow_array");
    if (schema == NULL || array == NULL) {
        return -1;
    }
    if (schema->release == NULL || array->release == NULL) {
        PyErr_SetString(PyExc_ValueError, "the Arrow export has been released (moved to another consumer)");
        return -1;
    }
    if (schema->format == NULL || strcmp(schema->format, "+w:4") != 0 || schema->n_children != 1
        || schema->children == NULL || schema->children[0] == NULL || schema->children[0]->format == NULL
        || strcmp(schema->children[0]->format, "C") != 0 || schema->dictionary != NULL) {
        PyErr_SetString(PyExc_ValueError, "the Arrow schema is not a fixed-size list of 4 uint8 per pixel");
        return -1;
    }
    if (array->length < 0 || array->length > INT64_MAX / 4 || array->null_count != 0 || array->offset != 0 || array->n_children != 1
        || array->children == NULL || array->children[0] == NULL || array->dictionary != NULL) {
        PyErr_SetString(PyExc_ValueError, "the Arrow array is not a plain list of pixels (nulls, offset or no child)");
        return -1;
    }
    const struct ArrowArray *values = array->children[0];
    if (values->null_count != 0 || values->offset != 0 || values->n_buffers != 2 || values->buffers == NULL
        || values->length != 4 * array->length || (array->length > 0 && values->buffers[1] == NULL)) {
        PyErr_SetString(PyExc_ValueError, "the Arrow array's values are not 4 bytes per pixel in one buffer");
        return -1;
    }
    *data = values->buffers[1];
    *count = array->length;
    return 0;
}

/* Bytes [start, stop) of the 3-byte packing: whole pixels through the kernel, a partial pixel
   at either end byte by byte. */
static void
pack3_range(pack_fn loop, uint8_t *dst, const uint8_t *pixels, size_t start, size_t stop)
{
    while (start < stop && start % 3 != 0) {
        *dst++ = pixels[start / 3 * 4 + start % 3];
        start++;
    }
    size_t whole = (stop - start) / 3;
    loop(dst, pixels + start / 3 * 4, whole);
    dst += 3 * whole;
    start += 3 * whole;
    while (start < stop) {
        *dst++ = pixels[start / 3 * 4 + start % 3];
        start++;
    }
}

PyDoc_STRVAR(pack_doc,
"pack(schema, array, channels, start, stop, out, /) -> int\n"
"\n"
"Write bytes [start, stop) of the image's pixels, `channels` bytes per pixel, into `out` (a\n"
"writable contiguous buffer) and return how many were written. (schema, array) are the capsules\n"
"of Image.__arrow_c_array__(). channels=3 keeps the first three of Pillow's four bytes per pixel\n"
"(RGB, YCbCr, HSV), 4 copies all four (RGBA, RGBX, RGBa, CMYK): the bytes of\n"
"np.asarray(image). Runs without the GIL. Raises TypeError or ValueError for anything but a\n"
"single-block export of 4-byte pixels and a range within it.");

static PyObject *
pack(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "pack() takes 6 positional arguments (%zd given)", nargs);
        return NULL;
    }
    const uint8_t *pixels;
    int64_t count;
    if (arrow_pixels(args[0], args[1], &pixels, &count) < 0) {
        return NULL;
    }
    Py_ssize_t channels, start, stop;
    if (index_arg(args[2], "channels", &channels) < 0 || index_arg(args[3], "start", &start) < 0
        || index_arg(args[4], "stop", &stop) < 0) {
        return NULL;
    }
    if (channels != 3 && channels != 4) {
        PyErr_Format(PyExc_ValueError, "channels must be 3 or 4, not %zd", channels);
        return NULL;
    }
    /* count * 4 bytes exist in memory, so count * channels fits in int64. */
    int64_t total = count * channels;
    if (start < 0 || stop < start || (int64_t)stop > total) {
        PyErr_Format(PyExc_ValueError, "bytes [%zd, %zd) are not within the image's %lld pixel bytes",
                     start, stop, (long long)total);
        return NULL;
    }
    Py_buffer out;
    if (PyObject_GetBuffer(args[5], &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "out must be a writable contiguous buffer (a bytearray), not %.100s",
                     Py_TYPE(args[5])->tp_name);
        return NULL;
    }
    size_t nbytes = (size_t)(stop - start);
    if ((size_t)out.len < nbytes) {
        PyErr_Format(PyExc_ValueError, "out holds %zd bytes; bytes [%zd, %zd) need %zu", out.len, start, stop,
                     nbytes);
        PyBuffer_Release(&out);
        return NULL;
    }
    uint8_t *dst = out.buf;
    pack_fn loop = pack3; /* read with the GIL held, as kernel() writes it */
    if (nbytes > 0) {
        Py_BEGIN_ALLOW_THREADS
        if (channels == 3) {
            pack3_range(loop, dst, pixels, (size_t)start, (size_t)stop);
        } else {
            memcpy(dst, pixels + start, nbytes);
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&out);
    return PyLong_FromSize_t(nbytes);
}

PyDoc_STRVAR(kernel_doc,
"kernel(name=None, /) -> str\n"
"\n"
"The 3-byte packing loop in use: 'avx2', 'ssse3' or 'portable' (chosen for this CPU at import).\n"
"With a name, switch to that loop first (the tests compare them); ValueError if this CPU or\n"
"build lacks it.");

static PyObject *
kernel(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    static const struct {
        const char *name;
        pack_fn fn;
    } kernels[] = {
#ifdef MMFRONT_X86_SIMD
        {"avx2", pack3_avx2},
        {"ssse3", pack3_ssse3},
#endif
        {"portable", pack3_portable},
    };
    const size_t n_kernels = sizeof(kernels) / sizeof(kernels[0]);
    if (nargs > 1) {
        PyErr_Format(PyExc_TypeError, "kernel() takes at most 1 argument (%zd given)", nargs);
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        const char *wanted = PyUnicode_Check(args[0]) ? PyUnicode_AsUTF8(args[0]) : NULL;
        if (wanted == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "kernel() name must be a str or None");
            }
            return NULL;
        }
        size_t k = 0;
        while (k < n_kernels && strcmp(kernels[k].name, wanted) != 0) {
            k++;
        }
        if (k == n_kernels || !kernel_supported(kernels[k].fn)) {
            PyErr_Format(PyExc_ValueError, "kernel %R is not available on this CPU or build", args[0]);
            return NULL;
        }
        pack3 = kernels[k].fn;
    }
    for (size_t k = 0; k < n_kernels; k++) {
        if (kernels[k].fn == pack3) {
            return PyUnicode_FromString(kernels[k].name);
        }
    }
    PyErr_SetString(PyExc_RuntimeError, "unknown packing kernel");
    return NULL;
}

/* One pass from planar uint8 pixels to planar values through a per-channel table: each plane
   reads its own 256-entry table, so the loop is a plain gather the compiler unrolls. */
#define LUT_PLANES(T)                                                                            \
    do {                                                                                         \
        const T *table = (const T *)lut;                                                         \
        T *values = (T *)dst;                                                                    \
        for (size_t c = 0; c < channels; c++) {                                                  \
            const T *t = table + 256 * c;                                                        \
            const uint8_t *in = src + c * n_pixels;                                              \
            T *out = values + c * n_pixels;                                                      \
            for (size_t i = 0; i < n_pixels; i++) {                                              \
                out[i] = t[in[i]];                                                               \
            }                                                                                    \
        }                                                                                        \
    } while (0)

/* The same from interleaved pixels (src: n pixels x channels bytes, as a channels-last image lies),
   still to planar values: one pass over the pixels, each channel's value to its own plane. */
#define LUT_INTERLEAVED(T)                                                                       \
    do {                                                                                         \
        const T *table = (const T *)lut;                                                         \
        T *values = (T *)dst;                                                                    \
        if (channels == 3) {                                                                     \
            const T *t0 = table, *t1 = table + 256, *t2 = table + 512;                           \
            T *o0 = values, *o1 = values + n_pixels, *o2 = values + 2 * n_pixels;                \
            for (size_t i = 0; i < n_pixels; i++) {                                              \
                const uint8_t *px = src + 3 * i;                                                 \
                o0[i] = t0[px[0]];                                                               \
                o1[i] = t1[px[1]];                                                               \
                o2[i] = t2[px[2]];                                                               \
            }                                                                                    \
        } else {                                                                                 \
            for (size_t c = 0; c < channels; c++) {                                              \
                const T *t = table + 256 * c;                                                    \
                T *out = values + c * n_pixels;                                                  \
                for (size_t i = 0; i < n_pixels; i++) {                                          \
                    out[i] = t[src[i * channels + c]];                                           \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    } while (0)

PyDoc_STRVAR(lut_planes_doc,
"lut_planes(src, lut, dst, channels, /) -> None\n"
"\n"
"dst[c, i] = lut[c, src[c, i]]: planar uint8 pixels (src, channels x n bytes) to planar values\n"
"(dst, channels x n items) through a table of 256 items per channel (lut, channels x 256 items\n"
"of 2 or 4 bytes, copied bit for bit). All three are C-contiguous buffers; runs without the\n"
"GIL. Raises TypeError or ValueError for buffers that do not fit.");

PyDoc_STRVAR(lut_interleaved_doc,
"lut_interleaved(src, lut, dst, channels, /) -> None\n"
"\n"
"dst[c, i] = lut[c, src[i, c]]: as lut_planes, from interleaved uint8 pixels (src, n x channels\n"
"bytes: a channels-last image) to planar values, so a channels-last image needs no planar copy\n"
"first. Runs without the GIL. Raises TypeError or ValueError for buffers that do not fit.");

static PyObject *
lut_any(PyObject *const *args, Py_ssize_t nargs, int interleaved)
{
    const char *name = interleaved ? "lut_interleaved" : "lut_planes";
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "%s() takes 4 positional arguments (%zd given)", name, nargs);
        return NULL;
    }
    Py_ssize_t channels_arg;
    if (index_arg(args[3], "channels", &channels_arg) < 0) {
        return NULL;
    }
    if (channels_arg < 1 || channels_arg > 4) {
        PyErr_Format(PyExc_ValueError, "channels must be 1 to 4, not %zd", channels_arg);
        return NULL;
    }
    size_t channels = (size_t)channels_arg;
    Py_buffer in, table, out;
    if (PyObject_GetBuffer(args[0], &in, PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &table, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&in);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&table);
        PyBuffer_Release(&in);
        return NULL;
    }
    PyObject *result = NULL;
    size_t n_pixels = (size_t)in.len / channels;
    size_t item = (size_t)table.len / (256 * channels);
    if ((size_t)in.len % channels != 0) {
        PyErr_Format(PyExc_ValueError, "src holds %zd bytes, not %zu planes of equal size", in.len, channels);
    } else if ((item != 2 && item != 4) || (size_t)table.len != 256 * channels * item) {
        PyErr_Format(PyExc_ValueError, "lut must hold 256 items of 2 or 4 bytes per channel, got %zd bytes",
                     table.len);
    } else if ((size_t)out.len != n_pixels * channels * item) {
        PyErr_Format(PyExc_ValueError, "dst holds %zd bytes; %zu pixels of %zu channels need %zu", out.len,
                     n_pixels, channels, n_pixels * channels * item);
    } else {
        const uint8_t *src = in.buf;
        const void *lut = table.buf;
        void *dst = out.buf;
        Py_BEGIN_ALLOW_THREADS
        if (interleaved) {
            if (item == 2) {
                LUT_INTERLEAVED(uint16_t);
            } else {
                LUT_INTERLEAVED(uint32_t);
            }
        } else if (item == 2) {
            LUT_PLANES(uint16_t);
        } else {
            LUT_PLANES(uint32_t);
        }
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&table);
    PyBuffer_Release(&in);
    return result;
}

static PyObject *
lut_planes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return lut_any(args, nargs, 0);
}

static PyObject *
lut_interleaved(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return lut_any(args, nargs, 1);
}

PyDoc_STRVAR(patchify_doc,
"patchify(src, dst, batch, channels, height, width, itemsize, patch, merge, temporal, channels_last, /) -> None\n"
"\n"
"The patch rows of Qwen2-VL's image processor (its ``patchify``) in one pass: src holds batch x\n"
"channels x height x width items of itemsize bytes, C-contiguous in that order, or with\n"
"channels_last in the order batch x height x width x channels; dst the rows [batch,\n"
"height/patch/merge, width/patch/merge, merge, merge] of channels x temporal x patch x patch\n"
"items, each image repeated temporal times, as HF's permute + expand + reshape lays them out.\n"
"Items are copied bit for bit; runs without the GIL. Raises ValueError for sizes that do not fit.");

/* One patch row of one channel: patch items, `step` bytes apart in src, to consecutive items. */
static inline void
gather_items(uint8_t *dst, const uint8_t *src, size_t patch, size_t item, size_t step)
{
    if (step == item) {
        memcpy(dst, src, patch * item);
    } else if (item == 1) {
        for (size_t px = 0; px < patch; px++) {
            dst[px] = src[px * step];
        }
    } else {
        for (size_t px = 0; px < patch; px++) {
            memcpy(dst + px * item, src + px * step, item);
        }
    }
}

/* One patch row of one plane: a fixed-size copy where the patch is Qwen's 14 or 16 pixels (two
   or one inline moves instead of a call). */
static inline void
copy_line(uint8_t *dst, const uint8_t *src, size_t patch)
{
    if (patch == 14) {
        memcpy(dst, src, 14);
    } else if (patch == 16) {
        memcpy(dst, src, 16);
    } else {
        memcpy(dst, src, patch);
    }
}

/* The patch rows of one band of patch x merge image rows, from its three planes (`line` bytes
   from one row of a plane to the next): every patch row of a plane is one fixed-size copy to each
   of its temporal places. Returns dst past the band's rows. */
static uint8_t *
patch_band(uint8_t *dst, const uint8_t *const *planes, size_t line, size_t width, size_t patch, size_t merge,
           size_t temporal)
{
    size_t unit = patch * merge;
    size_t block = patch * patch;
    for (size_t x0 = 0; x0 < width; x0 += unit) {
        for (size_t my = 0; my < merge; my++) {
            for (size_t mx = 0; mx < merge; mx++) {
                for (size_t c = 0; c < 3; c++) {
                    const uint8_t *from = planes[c] + my * patch * line + x0 + mx * patch;
                    for (size_t py = 0; py < patch; py++) {
                        for (size_t t = 0; t < temporal; t++) {
                            copy_line(dst + t * block + py * patch, from + py * line, patch);
                        }
                    }
                    dst += temporal * block;
                }
            }
        }
    }
    return dst;
}

/* The patch rows of channels-last 3-byte pixels: each band of patch x merge image rows is split
   into three planes once (16 pixels a step), then laid out by patch_band. Reading each channel's
   bytes 3 apart, a byte at a time, and copying the temporal blocks after took 1.64 ms for a
   1036x756 image's rows (patch 14, merge 2, temporal 2; 4.7 MB out); this takes 0.62 ms, where a
   plain copy of the rows takes 0.24. -1 when the band's scratch memory cannot be had (the caller
   takes the generic loop). */
static int
patchify_rgb8(uint8_t *dst, const uint8_t *src, size_t batch, size_t height, size_t width, size_t patch,
              size_t merge, size_t temporal)
{
    size_t unit = patch * merge;
    uint8_t *scratch = malloc(3 * unit * width);
    if (scratch == NULL) {
        return -1;
    }
    const uint8_t *planes[3] = {scratch, scratch + unit * width, scratch + 2 * unit * width};
    for (size_t b = 0; b < batch; b++) {
        const uint8_t *image = src + b * height * width * 3;
        for (size_t y0 = 0; y0 < height; y0 += unit) {
            for (size_t y = 0; y < unit; y++) {
                split3(scratch + y * width, scratch + (unit + y) * width, scratch + (2 * unit + y) * width,
                       image + (y0 + y) * width * 3, width);
            }
            dst = patch_band(dst, planes, width, width, patch, merge, temporal);
        }
    }
    free(scratch);
    return 0;
}

/* The same from 1-byte RGB planes (a resize into planes, mmfront._bicubic), read where they lie. */
static void
patchify_planes8(uint8_t *dst, const uint8_t *src, size_t batch, size_t height, size_t width, size_t patch,
                 size_t merge, size_t temporal)
{
    size_t unit = patch * merge;
    size_t plane = height * width;
    for (size_t b = 0; b < batch; b++) {
        const uint8_t *image = src + b * 3 * plane;
        for (size_t y0 = 0; y0 < height; y0 += unit) {
            const uint8_t *planes[3] = {image + y0 * width, image + plane + y0 * width, image + 2 * plane + y0 * width};
            dst = patch_band(dst, planes, width, width, patch, merge, temporal);
        }
    }
}

static PyObject *
patchify(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 11) {
        PyErr_Format(PyExc_TypeError, "patchify() takes 11 positional arguments (%zd given)", nargs);
        return NULL;
    }
    static const char *const names[] = {"batch", "channels", "height", "width", "itemsize", "patch", "merge",
                                        "temporal"};
    Py_ssize_t v[8];
    for (int i = 0; i < 8; i++) {
        if (index_arg(args[2 + i], names[i], &v[i]) < 0) {
            return NULL;
        }
        if (v[i] < 1) {
            PyErr_Format(PyExc_ValueError, "%s must be positive, not %zd", names[i], v[i]);
            return NULL;
        }
    }
    int channels_last = PyObject_IsTrue(args[10]);
    if (channels_last < 0) {
        return NULL;
    }
    size_t batch = (size_t)v[0], channels = (size_t)v[1], height = (size_t)v[2], width = (size_t)v[3];
    size_t item = (size_t)v[4], patch = (size_t)v[5], merge = (size_t)v[6], temporal = (size_t)v[7];
    size_t unit = patch * merge;
    if (height % unit != 0 || width % unit != 0) {
        PyErr_Format(PyExc_ValueError, "height %zu and width %zu must be multiples of patch x merge (%zu)", height,
                     width, unit);
        return NULL;
    }
    Py_buffer in, out;
    if (PyObject_GetBuffer(args[0], &in, PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&in);
        return NULL;
    }
    PyObject *result = NULL;
    size_t total = batch * channels * height * width * item;
    if ((size_t)in.len != total) {
        PyErr_Format(PyExc_ValueError, "src holds %zd bytes; %zu x %zu x %zu x %zu items of %zu bytes need %zu",
                     in.len, batch, channels, height, width, item, total);
    } else if ((size_t)out.len != total * temporal) {
        PyErr_Format(PyExc_ValueError, "dst holds %zd bytes, not the %zu of %zu temporal copies", out.len,
                     total * temporal, temporal);
    } else {
        const uint8_t *src = in.buf;
        uint8_t *dst = out.buf;
        size_t line = patch * item;  /* one patch row of one channel, in dst */
        size_t block = patch * line; /* one patch of one channel, in dst */
        /* byte steps in src: along a row, down a column, to the next channel */
        size_t step = channels_last ? channels * item : item;
        size_t row_bytes = width * step;
        size_t plane = channels_last ? item : height * row_bytes;
        size_t image_bytes = channels * height * width * item;
        Py_BEGIN_ALLOW_THREADS
        int done = channels == 3 && item == 1;
        if (done && channels_last) {
            done = patchify_rgb8(dst, src, batch, height, width, patch, merge, temporal) == 0;
        } else if (done) {
            patchify_planes8(dst, src, batch, height, width, patch, merge, temporal);
        }
        for (size_t b = 0; !done && b < batch; b++) {
            const uint8_t *image = src + b * image_bytes;
            for (size_t y0 = 0; y0 < height; y0 += unit) {
                for (size_t x0 = 0; x0 < width; x0 += unit) {
                    for (size_t my = 0; my < merge; my++) {
                        for (size_t mx = 0; mx < merge; mx++) {
                            const uint8_t *corner = image + (y0 + my * patch) * row_bytes + (x0 + mx * patch) * step;
                            for (size_t c = 0; c < channels; c++) {
                                const uint8_t *from = corner + c * plane;
                                uint8_t *first = dst;
                                for (size_t py = 0; py < patch; py++) {
                                    gather_items(dst, from + py * row_bytes, patch, item, step);
                                    dst += line;
                                }
                                for (size_t t = 1; t < temporal; t++) {
                                    memcpy(dst, first, block);
                                    dst += block;
                                }
                            }
                        }
                    }
                }
            }
        }
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&in);
    return result;
}

static PyMethodDef pixels_methods[] = {
    {"pack", (PyCFunction)(void (*)(void))pack, METH_FASTCALL, pack_doc},
    {"lut_planes", (PyCFunction)(void (*)(void))lut_planes, METH_FASTCALL, lut_planes_doc},
    {"lut_interleaved", (PyCFunction)(void (*)(void))lut_interleaved, METH_FASTCALL, lut_interleaved_doc},
    {"patchify", (PyCFunction)(void (*)(void))patchify, METH_FASTCALL, patchify_doc},
    {"kernel", (PyCFunction)(void (*)(void))kernel, METH_FASTCALL, kernel_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef pixels_module = {
    PyModuleDef_HEAD_INIT,
    "mmfront._pixels",
    "Packs PIL pixels from Pillow's Arrow export without the GIL (optional; mmfront.pixels falls back).",
    -1,
    pixels_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__pixels(void)
{
    pack3 = best_pack3();
    split3 = best_split3();
    return PyModule_Create(&pixels_module);
}
