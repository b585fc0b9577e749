/* bookie._records: the reader's record walks (bookie.entry.sparse_runs and
 * decode_sparse) and CRC-32, in C.
 *
 * A catch-up reader's thread spent most of its time in sparse_runs' Python
 * loop: per record a header unpack, a memoryview slice and a CRC call (about
 * 70 % of the reader at 100-byte entries, 35 % at 1 KiB; issue 18).  This is
 * the same walk with no Python object per record, and decode_sparse's (an
 * Entry per record, for read_entries) with nothing else made: each returns
 * what its Python walk returns and raises what it raises
 * (tests/test_records_native.py runs both on the same frames), and
 * bookie/entry.py falls back to the Python walks where this module was not
 * built.
 *
 * CRC-32 here is zlib's (polynomial 0xEDB88320 reflected, value inverted in
 * and out), as bookie/crc.py's.  On x86-64 with PCLMULQDQ, 64 bytes and more
 * are folded with carry-less multiplies (128-bit lanes folded forward by 512
 * bits, then by 128, then reduced to 32 bits by Barrett reduction: Gopal et
 * al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
 * Instruction", Intel, 2009); with AVX-512 and VPCLMULQDQ, 256 bytes and
 * more four lanes at a time, as ISA-L folds: one 128-bit lane at a time ran
 * at a fifth of ISA-L's speed on 64 KiB, slower than the Python walk calling
 * ISA-L.  With VPCLMULQDQ and AVX2 but no AVX-512, 128 bytes and more two
 * lanes at a time (256-bit registers): 24 GB/s on 64 KiB on this machine,
 * against 12.4 for the 128-bit lanes and 12.5 for ISA-L's crc32, which
 * bookie/crc.py then gives way to this one.  The folding constants are
 * x^n mod P for the n named beside each, bit-reflected and shifted left by
 * one (tests/test_records_native.py derives them again).  The rest, and
 * every byte on other machines, goes through slicing-by-8 tables.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_CLMUL 1
#endif

/* -- CRC-32 ------------------------------------------------------------------------ */

static uint32_t crc_table[8][256];

static void
make_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        crc_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (uint32_t i = 0; i < 256; i++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
}

/* The CRC register over n bytes (no inversion in or out). */
static uint32_t
crc_bytes(uint32_t c, const uint8_t *p, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^ crc_table[5][(w >> 16) & 0xff]
            ^ crc_table[4][(w >> 24) & 0xff] ^ crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff]
            ^ crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
#endif
    while (n--)
        c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
    return c;
}

#ifdef HAVE_CLMUL
#define CLMUL_TARGET __attribute__((target("pclmul,sse4.1")))
#define VPCLMUL_TARGET __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.1")))
#define VPCLMUL256_TARGET __attribute__((target("avx2,vpclmulqdq,pclmul,sse4.1")))

/* Folding a 128-bit lane forward by D bits: its low qword times x^(D+32),
 * its high qword times x^(D-32) (reflected), added to what lies D bits on. */
CLMUL_TARGET static inline __m128i
fold(__m128i x, __m128i k, __m128i data)
{
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), data);
}

/* The last 128 bits of the register folded in (n < 16 bytes left beside
 * them: folded by 128 bits at a time first), reduced to the 32-bit CRC.
 * Inlined into each caller, so the wide ways run it VEX-encoded (see
 * end_wide). */
CLMUL_TARGET static inline __attribute__((always_inline)) uint32_t
clmul_finish(__m128i x1, const uint8_t *p, size_t n)
{
    const __m128i k34 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL); /* x^96, x^160: by 128 bits */
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124LL);              /* x^64: 64 bits to 32 */
    const __m128i pu = _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL);  /* floor(x^64 / P), P */
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    while (n >= 16) {
        x1 = fold(x1, k34, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        n -= 16;
    }
    /* 128 bits to 64, with 32 zero bits appended: the low qword times x^96 */
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(k34, x1, 0x01));
    /* 64 bits to 32: the low dword times x^64 */
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 4), _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k5, 0x00));
    /* Barrett reduction: q = (low dword * mu) mod x^32; register ^= q * P */
    __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), pu, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), pu, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(x1, t), 1);
}

/* The CRC register over n bytes, n >= 64 and a multiple of 16: four
 * 128-bit lanes folded by 512 bits, then into one. */
CLMUL_TARGET static uint32_t
crc_clmul(uint32_t c, const uint8_t *p, size_t n)
{
    const __m128i k12 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL); /* x^480, x^544: by 512 bits */
    const __m128i k34 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL); /* x^96, x^160: by 128 bits */
    __m128i x1 = _mm_loadu_si128((const __m128i *)p), x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32)), x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)c));
    p += 64;
    n -= 64;
    while (n >= 64) {
        x1 = fold(x1, k12, _mm_loadu_si128((const __m128i *)p));
        x2 = fold(x2, k12, _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = fold(x3, k12, _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = fold(x4, k12, _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }
    x1 = fold(x1, k34, x2);
    x1 = fold(x1, k34, x3);
    x1 = fold(x1, k34, x4);
    return clmul_finish(x1, p, n);
}

VPCLMUL_TARGET static inline __m512i
fold512(__m512i x, __m512i k, __m512i data)
{
    /* 0x96: a ^ b ^ c */
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11),
                                     data, 0x96);
}

/* The CRC register over n bytes, n >= 256 and a multiple of 16: 512-bit
 * registers (four 128-bit lanes each, folded lane by lane as crc_clmul's),
 * four of them folded by 2048 bits, then into one by 512, its lanes into
 * one 128-bit register. */
VPCLMUL_TARGET static uint32_t
crc_vpclmul(uint32_t c, const uint8_t *p, size_t n)
{
    const __m512i k2048 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x1322d1430LL, 0x11542778aLL)); /* x^2016, x^2080 */
    const __m512i k512 = _mm512_broadcast_i32x4(_mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL));  /* x^480, x^544 */
    /* lane 0 by 384 bits (x^352, x^416), lane 1 by 256 (x^224, x^288), lane 2 by 128 (x^96, x^160), lane 3 stays */
    const __m512i klanes = _mm512_set_epi64(0, 0, 0x0ccaa009eLL, 0x1751997d0LL, 0x15a546366LL, 0x0f1da05aaLL,
                                            0x174359406LL, 0x03db1ecdcLL);
    __m512i z0 = _mm512_loadu_si512(p), z1 = _mm512_loadu_si512(p + 64);
    __m512i z2 = _mm512_loadu_si512(p + 128), z3 = _mm512_loadu_si512(p + 192);
    z0 = _mm512_xor_si512(z0, _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)c)));
    p += 256;
    n -= 256;
    while (n >= 256) {
        z0 = fold512(z0, k2048, _mm512_loadu_si512(p));
        z1 = fold512(z1, k2048, _mm512_loadu_si512(p + 64));
        z2 = fold512(z2, k2048, _mm512_loadu_si512(p + 128));
        z3 = fold512(z3, k2048, _mm512_loadu_si512(p + 192));
        p += 256;
        n -= 256;
    }
    z0 = fold512(z0, k512, z1);
    z0 = fold512(z0, k512, z2);
    z0 = fold512(z0, k512, z3);
    while (n >= 64) {
        z0 = fold512(z0, k512, _mm512_loadu_si512(p));
        p += 64;
        n -= 64;
    }
    __m512i z = fold512(z0, klanes, _mm512_setzero_si512());   /* lane 3's product is 0: add lane 3 itself */
    __m128i x1 = _mm_xor_si128(_mm_xor_si128(_mm512_castsi512_si128(z), _mm512_extracti32x4_epi32(z, 1)),
                               _mm_xor_si128(_mm512_extracti32x4_epi32(z, 2), _mm512_extracti32x4_epi32(z, 3)));
    x1 = _mm_xor_si128(x1, _mm512_extracti32x4_epi32(z0, 3));
    uint32_t r = clmul_finish(x1, p, n);
    _mm256_zeroupper();   /* see end_wide */
    return r;
}

VPCLMUL256_TARGET static inline __m256i
fold256(__m256i x, __m256i k, __m256i data)
{
    return _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00),
                                             _mm256_clmulepi64_epi128(x, k, 0x11)), data);
}

/* The CRC register over n bytes, n >= 128 and a multiple of 16, on AVX2
 * with VPCLMULQDQ and no AVX-512 (AMD Zen 3 and 4's client parts, Intel's
 * Alder Lake and later cores): 256-bit registers (two 128-bit lanes each,
 * folded lane by lane as crc_clmul's), four of them folded by 1024 bits,
 * then into one by 256, its lanes into one 128-bit register. */
VPCLMUL256_TARGET static uint32_t
crc_vpclmul256(uint32_t c, const uint8_t *p, size_t n)
{
    const __m256i k1024 = _mm256_broadcastsi128_si256(_mm_set_epi64x(0x14a7fe880LL, 0x1e88ef372LL)); /* x^992, x^1056 */
    const __m256i k256 = _mm256_broadcastsi128_si256(_mm_set_epi64x(0x15a546366LL, 0x0f1da05aaLL));  /* x^224, x^288 */
    const __m128i k34 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);                               /* x^96, x^160 */
    __m256i y0 = _mm256_loadu_si256((const __m256i *)p), y1 = _mm256_loadu_si256((const __m256i *)(p + 32));
    __m256i y2 = _mm256_loadu_si256((const __m256i *)(p + 64)), y3 = _mm256_loadu_si256((const __m256i *)(p + 96));
    y0 = _mm256_xor_si256(y0, _mm256_zextsi128_si256(_mm_cvtsi32_si128((int)c)));
    p += 128;
    n -= 128;
    while (n >= 128) {
        y0 = fold256(y0, k1024, _mm256_loadu_si256((const __m256i *)p));
        y1 = fold256(y1, k1024, _mm256_loadu_si256((const __m256i *)(p + 32)));
        y2 = fold256(y2, k1024, _mm256_loadu_si256((const __m256i *)(p + 64)));
        y3 = fold256(y3, k1024, _mm256_loadu_si256((const __m256i *)(p + 96)));
        p += 128;
        n -= 128;
    }
    y0 = fold256(y0, k256, y1);
    y0 = fold256(y0, k256, y2);
    y0 = fold256(y0, k256, y3);
    while (n >= 32) {
        y0 = fold256(y0, k256, _mm256_loadu_si256((const __m256i *)p));
        p += 32;
        n -= 32;
    }
    __m128i x1 = fold(_mm256_castsi256_si128(y0), k34, _mm256_extracti128_si256(y0, 1));
    uint32_t r = clmul_finish(x1, p, n);
    /* end_wide: the upper halves of the wide registers cleared before going
     * back to code encoded without VEX (GCC put no VZEROUPPER in these
     * target("avx2") functions): without it a 100-byte record's CRC cost
     * 4.5x the 128-bit way's, every SSE instruction after it paying for
     * the dirty upper state. */
    _mm256_zeroupper();
    return r;
}
#endif

enum { CRC_TABLE = 0, CRC_CLMUL = 1, CRC_VPCLMUL256 = 2, CRC_VPCLMUL = 3 };
static int crc_best = CRC_TABLE;   /* what this machine runs (PyInit__records) */
static const char *const crc_names[] = {"slicing-by-8", "pclmul", "vpclmul-256", "vpclmul"};

/* zlib's crc32(value, p, n), by the given way (up to crc_best). */
static uint32_t
crc32_by(int way, uint32_t value, const uint8_t *p, size_t n)
{
    uint32_t c = ~value;
#ifdef HAVE_CLMUL
    if (way == CRC_VPCLMUL && n >= 256) {
        size_t m = n & ~(size_t)15;
        c = crc_vpclmul(c, p, m);
        p += m;
        n -= m;
    } else if (way >= CRC_VPCLMUL256 && n >= 128) {
        size_t m = n & ~(size_t)15;
        c = crc_vpclmul256(c, p, m);
        p += m;
        n -= m;
    } else if (way >= CRC_CLMUL && n >= 64) {
        size_t m = n & ~(size_t)15;
        c = crc_clmul(c, p, m);
        p += m;
        n -= m;
    }
#else
    (void)way;
#endif
    return ~crc_bytes(c, p, n);
}

static inline uint32_t
crc32_zlib(uint32_t value, const uint8_t *p, size_t n)
{
    return crc32_by(crc_best, value, p, n);
}

/* -- the record walk ----------------------------------------------------------------- */

/* The entry record's header (bookie/entry.py ENTRY_HEADER, little-endian):
 * payload_len u32 @0, checksum u32 @4, req_flags u16 @8, term u64 @10,
 * ledger_id u64 @18, entry_id i64 @26, lac @34, lafr @42, data_flags u16 @50,
 * origin @52; the checksum covers [18, end of the record). */
enum { HEADER_SIZE = 60, CHECKSUM_START = 18, FLAG_NOOP = 1, MAX_STEPS = 256 };

static PyObject *MalformedEntry, *ChecksumMismatch, *ArrayType;
static PyTypeObject *EntryType;   /* bookie.entry.Entry: a tuple of 7 (bind()) */

static inline uint16_t
le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t
le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t
le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* Raises ChecksumMismatch(ledger_id, entry_id). */
static void
checksum_mismatch(uint64_t lid, int64_t eid)
{
    PyObject *e = PyObject_CallFunction(ChecksumMismatch, "KL", (unsigned long long)lid, (long long)eid);
    if (e != NULL) {
        PyErr_SetObject(ChecksumMismatch, e);
        Py_DECREF(e);
    }
}

/* What both walks take: a frame (its buffer held until frame_release), the
 * ledger its records must be of, the id they must all be above, and where
 * in the buffer they lie ([start, stop), stop clamped to the buffer). */
typedef struct {
    Py_buffer view;
    PyObject *ledger_obj;   /* as asked (for messages) */
    uint64_t ledger_id;
    int ledger_ok;          /* 0: an id no record can carry (negative, too large): every record is another's */
    long long after;
    Py_ssize_t start, stop;
} Frame;

static int
frame_open(Frame *f, PyObject *buf_obj, PyObject *ledger_obj, PyObject *after_obj, Py_ssize_t start,
           PyObject *stop_obj)
{
    f->ledger_obj = ledger_obj;
    f->ledger_id = PyLong_AsUnsignedLongLong(ledger_obj);
    f->ledger_ok = 1;
    if (f->ledger_id == (uint64_t)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        f->ledger_ok = 0;
    }
    f->after = PyLong_AsLongLong(after_obj);
    if (f->after == -1 && PyErr_Occurred())
        return -1;
    Py_ssize_t stop = PY_SSIZE_T_MAX;
    if (stop_obj != Py_None && (stop = PyLong_AsSsize_t(stop_obj)) == -1 && PyErr_Occurred())
        return -1;
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "start < 0");
        return -1;
    }
    if (PyObject_GetBuffer(buf_obj, &f->view, PyBUF_SIMPLE) < 0)
        return -1;
    f->start = start;
    f->stop = stop < f->view.len ? stop : f->view.len;
    return 0;
}

static void
frame_release(Frame *f)
{
    PyBuffer_Release(&f->view);
}

/* One record's header fields and end. */
typedef struct {
    uint64_t lid, origin;
    int64_t eid, lac, lafr;
    uint16_t dflags;
    Py_ssize_t end;
} Record;

/* The record at `off` (< f->stop): its header and payload within the
 * frame, its checksum verified.  Raises MalformedEntry / ChecksumMismatch
 * (-1), as bookie/entry.py's walks do. */
static int
record_at(const Frame *f, Py_ssize_t off, Record *r)
{
    if (f->stop - off < HEADER_SIZE) {
        PyErr_SetString(MalformedEntry, "truncated entry header");
        return -1;
    }
    const uint8_t *h = (const uint8_t *)f->view.buf + off;
    uint32_t plen = le32(h), crc = le32(h + 4);
    r->lid = le64(h + 18);
    r->eid = (int64_t)le64(h + 26);
    r->lac = (int64_t)le64(h + 34);
    r->lafr = (int64_t)le64(h + 42);
    r->dflags = le16(h + 50);
    r->origin = le64(h + 52);
    r->end = off + HEADER_SIZE + (Py_ssize_t)plen;
    if (r->end > f->stop) {
        PyErr_SetString(MalformedEntry, "truncated entry payload");
        return -1;
    }
    if (crc32_zlib(0, h + CHECKSUM_START, (size_t)(r->end - off - CHECKSUM_START)) != crc) {
        checksum_mismatch(r->lid, r->eid);
        return -1;
    }
    return 0;
}

static inline int
of_ledger(const Frame *f, const Record *r)
{
    return f->ledger_ok && r->lid == f->ledger_id;
}

/* The order rule: a record of the frame's ledger, above `after` (-1: raised). */
static int
in_order(const Frame *f, const Record *r, long long after)
{
    if (of_ledger(f, r) && r->eid > after)
        return 0;
    PyErr_Format(MalformedEntry, "got entry %llu:%lld, wanted %S:>%lld", (unsigned long long)r->lid,
                 (long long)r->eid, f->ledger_obj, after);
    return -1;
}

typedef struct {
    uint64_t *v;
    size_t n, cap;
} Offsets;

static int
offsets_push(Offsets *o, uint64_t x)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        uint64_t *v = PyMem_Realloc(o->v, cap * sizeof(uint64_t));
        if (v == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = x;
    return 0;
}

/* Appends (first id, array('Q', offsets)) to runs. */
static int
close_run(PyObject *runs, int64_t first, Offsets *o)
{
    PyObject *raw = PyBytes_FromStringAndSize((const char *)o->v, (Py_ssize_t)(o->n * sizeof(uint64_t)));
    if (raw == NULL)
        return -1;
    PyObject *arr = PyObject_CallFunction(ArrayType, "sO", "Q", raw);
    Py_DECREF(raw);
    if (arr == NULL)
        return -1;
    PyObject *run = Py_BuildValue("(LN)", (long long)first, arr);
    if (run == NULL)
        return -1;
    int rc = PyList_Append(runs, run);
    Py_DECREF(run);
    o->n = 0;
    return rc;
}

static int
as_steps(PyObject *obj, int64_t *steps, Py_ssize_t *cyc)
{
    if (PyLong_Check(obj)) {
        steps[0] = PyLong_AsLongLong(obj);
        *cyc = 1;
        return steps[0] == -1 && PyErr_Occurred() ? -1 : 0;
    }
    PyObject *seq = PySequence_Fast(obj, "step: an int or a sequence of ints");
    if (seq == NULL)
        return -1;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    if (k < 1 || k > MAX_STEPS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "step: 1 to %d distances, got %zd", MAX_STEPS, k);
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        steps[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (steps[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    *cyc = k;
    return 0;
}

PyDoc_STRVAR(sparse_runs_doc,
"sparse_runs(buf, ledger_id, after, start=0, stop=None, step=1) -> (runs, no-ops)\n\n"
"bookie.entry.sparse_runs, with no Python object per record.");

static PyObject *
sparse_runs(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "ledger_id", "after", "start", "stop", "step", NULL};
    PyObject *buf_obj, *ledger_obj, *after_obj, *stop_obj = Py_None, *step_obj = NULL;
    Py_ssize_t start = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|nOO:sparse_runs", kwlist, &buf_obj, &ledger_obj, &after_obj,
                                     &start, &stop_obj, &step_obj))
        return NULL;
    if (MalformedEntry == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bookie._records: bind() was not called");
        return NULL;
    }
    int64_t steps[MAX_STEPS];
    Py_ssize_t cyc = 1;
    steps[0] = 1;
    if (step_obj != NULL && as_steps(step_obj, steps, &cyc) < 0)
        return NULL;
    Frame f;
    if (frame_open(&f, buf_obj, ledger_obj, after_obj, start, stop_obj) < 0)
        return NULL;
    long long after = f.after;
    PyObject *runs = PyList_New(0), *noops = PyList_New(0);
    Offsets offs = {NULL, 0, 0};
    int open = 0;
    int64_t nxt = -1, run_first = 0, run_last = 0;
    Py_ssize_t off = f.start;
    Record r;
    if (runs == NULL || noops == NULL)
        goto fail;
    while (off < f.stop) {
        if (record_at(&f, off, &r) < 0)
            goto fail;
        if (!open || r.eid != nxt || r.dflags || !of_ledger(&f, &r)) {
            if (open) {   /* the open run ends where this record starts */
                if (offsets_push(&offs, (uint64_t)off) < 0 || close_run(runs, run_first, &offs) < 0)
                    goto fail;
                open = 0;
                after = run_last;
            }
            if (in_order(&f, &r, after) < 0)
                goto fail;
            after = r.eid;
            if (r.dflags & FLAG_NOOP) {
                PyObject *x = PyLong_FromLongLong(r.eid);
                if (x == NULL || PyList_Append(noops, x) < 0) {
                    Py_XDECREF(x);
                    goto fail;
                }
                Py_DECREF(x);
                off = r.end;   /* (no run open: the next record starts one) */
                continue;
            }
            open = 1;
            run_first = r.eid;
        }
        if (offsets_push(&offs, (uint64_t)off) < 0)
            goto fail;
        run_last = r.eid;
        int64_t s = steps[((r.eid % cyc) + cyc) % cyc];
        nxt = (s > 0 && r.eid > INT64_MAX - s) ? -1 : r.eid + s;   /* (past the largest id: no record follows) */
        off = r.end;
    }
    if (open && (offsets_push(&offs, (uint64_t)off) < 0 || close_run(runs, run_first, &offs) < 0))
        goto fail;
    PyMem_Free(offs.v);
    frame_release(&f);
    return Py_BuildValue("(NN)", runs, noops);
fail:
    PyMem_Free(offs.v);
    frame_release(&f);
    Py_XDECREF(runs);
    Py_XDECREF(noops);
    return NULL;
}

PyDoc_STRVAR(decode_sparse_doc,
"decode_sparse(buf, ledger_id, after, start=0, stop=None) -> [Entry]\n\n"
"bookie.entry.decode_sparse: an Entry per record, made here.");

static PyObject *
decode_sparse(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"buf", "ledger_id", "after", "start", "stop", NULL};
    PyObject *buf_obj, *ledger_obj, *after_obj, *stop_obj = Py_None;
    Py_ssize_t start = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|nO:decode_sparse", kwlist, &buf_obj, &ledger_obj,
                                     &after_obj, &start, &stop_obj))
        return NULL;
    if (EntryType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bookie._records: bind() was not given Entry");
        return NULL;
    }
    Frame f;
    if (frame_open(&f, buf_obj, ledger_obj, after_obj, start, stop_obj) < 0)
        return NULL;
    long long after = f.after;
    int slice_bytes = PyBytes_CheckExact(buf_obj);   /* payloads: bytes of a bytes buf, else buf's own slices */
    Record r;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        goto fail;
    for (Py_ssize_t off = f.start; off < f.stop; off = r.end) {
        if (record_at(&f, off, &r) < 0 || in_order(&f, &r, after) < 0)
            goto fail;
        PyObject *payload = slice_bytes
            ? PyBytes_FromStringAndSize((const char *)f.view.buf + off + HEADER_SIZE, r.end - off - HEADER_SIZE)
            : PySequence_GetSlice(buf_obj, off + HEADER_SIZE, r.end);
        PyObject *e = payload == NULL ? NULL : EntryType->tp_alloc(EntryType, 7);
        if (e == NULL) {
            Py_XDECREF(payload);
            goto fail;
        }
        PyObject *fields[7] = {PyLong_FromUnsignedLongLong(r.lid), PyLong_FromLongLong(r.eid), payload,
                               PyLong_FromLongLong(r.lac), PyLong_FromLongLong(r.lafr), PyLong_FromLong(r.dflags),
                               PyLong_FromUnsignedLongLong(r.origin)};
        int bad = 0;
        for (int k = 0; k < 7; k++) {
            bad |= fields[k] == NULL;
            PyTuple_SET_ITEM(e, k, fields[k]);   /* (a NULL item is fine for the tuple's dealloc) */
        }
        if (bad || PyList_Append(out, e) < 0) {
            Py_DECREF(e);
            goto fail;
        }
        Py_DECREF(e);
        after = r.eid;
    }
    frame_release(&f);
    return out;
fail:
    frame_release(&f);
    Py_XDECREF(out);
    return NULL;
}

PyDoc_STRVAR(crc32_doc,
"crc32(data, value=0, way=None) -> int\n\n"
"zlib.crc32's value; way (tests): 0 slicing-by-8 tables only, 1 128-bit carry-less folding,\n"
"2 256-bit (AVX2), 3 512-bit (AVX-512), each where this machine has it (CRC names the best,\n"
"which None takes).  From 256 KiB on, the GIL is released meanwhile.");

enum { CRC_NOGIL_BYTES = 256 << 10 };   /* ~10 us at 25 GB/s: a GIL hand-over is worth it */

static PyObject *
crc32_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "crc32(data, value=0, way=None)");
        return NULL;
    }
    unsigned long value = 0;
    if (nargs >= 2 && (value = PyLong_AsUnsignedLongMask(args[1])) == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    int way = crc_best;
    if (nargs == 3 && args[2] != Py_None) {
        long w = PyLong_AsLong(args[2]);
        if (w == -1 && PyErr_Occurred())
            return NULL;
        if (w < 0 || w > crc_best) {
            PyErr_Format(PyExc_ValueError, "way %ld: this machine has 0..%d", w, crc_best);
            return NULL;
        }
        way = (int)w;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t c;
    if (view.len >= CRC_NOGIL_BYTES) {   /* (the buffer is held: another thread may run meanwhile) */
        Py_BEGIN_ALLOW_THREADS
        c = crc32_by(way, (uint32_t)value, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        c = crc32_by(way, (uint32_t)value, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

PyDoc_STRVAR(bind_doc,
"bind(MalformedEntry, ChecksumMismatch, Entry=None): the exceptions the walks raise and the\n"
"entries decode_sparse makes (bookie.entry's; Entry a tuple subclass of 7 fields).");

static PyObject *
bind(PyObject *module, PyObject *args)
{
    PyObject *malformed, *mismatch, *entry = Py_None;
    if (!PyArg_ParseTuple(args, "OO|O:bind", &malformed, &mismatch, &entry))
        return NULL;
    if (entry != Py_None && !(PyType_Check(entry) && PyType_IsSubtype((PyTypeObject *)entry, &PyTuple_Type)
                              && ((PyTypeObject *)entry)->tp_basicsize == PyTuple_Type.tp_basicsize)) {
        PyErr_SetString(PyExc_TypeError, "Entry: a tuple subclass with no other fields (a NamedTuple)");
        return NULL;
    }
    Py_XSETREF(MalformedEntry, Py_NewRef(malformed));
    Py_XSETREF(ChecksumMismatch, Py_NewRef(mismatch));
    Py_XSETREF(EntryType, entry == Py_None ? NULL : (PyTypeObject *)Py_NewRef(entry));
    Py_RETURN_NONE;
}

/* -- frame buffers ------------------------------------------------------------------ */

/* A catch-up reader receives a frame of about a MiB at a time into a new bytes
 * object: malloc gives such a block its own fresh pages (mmap, or the heap's
 * top, trimmed again once free), which the kernel zero-fills as the receive
 * first writes them.  Those page faults were 10-13 % of a catch-up reader's CPU
 * (perf; NOTES, session 17).  So frames of FRAME_POOL_MIN..FRAME_POOL_MAX bytes
 * come from a few bytes objects kept here and handed out again once nothing
 * else holds them (their reference count is the pool's alone): a block of
 * `cap` bytes serves a frame of n when n <= cap < 2n, its length set to n
 * (what _PyBytes_Resize does, without the realloc).  Bytes nobody else holds
 * cannot be seen changing.  The pool resets the bytes' cached hash, a field
 * deprecated since 3.11: from Python 3.13 on it is left out (new bytes each
 * time, as before). */
#define FRAME_POOL_SLOTS 48
#define FRAME_POOL_BYTES (32 << 20)   /* at most this much held (a reader's read-ahead, by default) */
#define FRAME_POOL_MIN (64 << 10)
#define FRAME_POOL_MAX (4 << 20)
#define FRAME_POOL_GRAIN (64 << 10)

#if PY_VERSION_HEX < 0x030D0000
#define HAVE_FRAME_POOL 1
#endif

static struct { PyObject *bytes; Py_ssize_t cap; } frame_pool[FRAME_POOL_SLOTS];
static Py_ssize_t frame_pool_held;   /* the caps of the bytes held */
static unsigned long long frame_pool_reused, frame_pool_made;

static void
frame_pool_drop(int i)
{
    frame_pool_held -= frame_pool[i].cap;
    frame_pool[i].cap = 0;
    Py_CLEAR(frame_pool[i].bytes);
}

#ifdef HAVE_FRAME_POOL
static PyObject *
bytes_of_length(PyObject *b, Py_ssize_t n)
{
    Py_SET_SIZE(b, n);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    ((PyBytesObject *)b)->ob_shash = -1;
#pragma GCC diagnostic pop
    PyBytes_AS_STRING(b)[n] = '\0';
    return b;
}
#endif

static PyObject *
new_frame_bytes(Py_ssize_t n)
{
#ifdef HAVE_FRAME_POOL
    if (n >= FRAME_POOL_MIN && n <= FRAME_POOL_MAX) {
        int spare = -1;   /* a slot empty, or else holding bytes nobody uses, of a size that does not serve */
        for (int i = 0; i < FRAME_POOL_SLOTS; i++) {
            PyObject *b = frame_pool[i].bytes;
            if (b == NULL) {
                if (spare < 0 || frame_pool[spare].bytes != NULL)
                    spare = i;
                continue;
            }
            if (Py_REFCNT(b) != 1)
                continue;
            if (frame_pool[i].cap >= n && frame_pool[i].cap < 2 * n) {
                frame_pool_reused++;
                Py_INCREF(b);
                return bytes_of_length(b, n);
            }
            if (spare < 0)
                spare = i;
        }
        Py_ssize_t cap = (n + FRAME_POOL_GRAIN - 1) / FRAME_POOL_GRAIN * FRAME_POOL_GRAIN;
        if (spare >= 0 && frame_pool_held - frame_pool[spare].cap + cap <= FRAME_POOL_BYTES) {
            PyObject *b = PyBytes_FromStringAndSize(NULL, cap);
            if (b == NULL)
                return NULL;
            frame_pool_drop(spare);
            frame_pool[spare].bytes = b;
            frame_pool[spare].cap = cap;
            frame_pool_held += cap;
            frame_pool_made++;
            Py_INCREF(b);
            return bytes_of_length(b, n);
        }
    }
#endif
    return PyBytes_FromStringAndSize(NULL, n);
}

PyDoc_STRVAR(frame_buffer_doc,
"frame_buffer(n) -> (bytes, memoryview): a bytes object of n bytes nobody else holds, not yet\n"
"filled, and a writable view of them: a reader receives a frame into the view (no zero-fill, no\n"
"copy to bytes afterwards), releases the view, then hands out the bytes.  The bytes must not be\n"
"used before then, and the view not after, nor once the bytes are dropped: bytes of 64 KiB to\n"
"4 MiB are kept (32 MiB at most) and given out again once nothing else holds them\n"
"(stream/read_port_client.py).");

PyDoc_STRVAR(frame_pool_doc,
"frame_pool(clear=False) -> (reused, made, held, held_bytes): frame_buffer's pool so far: frames\n"
"given bytes used before, bytes made for the pool; the bytes objects it holds now and their\n"
"size.  clear=True drops them first.");

static PyObject *
frame_pool_py(PyObject *module, PyObject *args)
{
    int clear = 0;
    if (!PyArg_ParseTuple(args, "|p:frame_pool", &clear))
        return NULL;
    Py_ssize_t held = 0;
    for (int i = 0; i < FRAME_POOL_SLOTS; i++) {
        if (clear && frame_pool[i].bytes != NULL)
            frame_pool_drop(i);
        held += frame_pool[i].bytes != NULL;
    }
    return Py_BuildValue("KKnn", frame_pool_reused, frame_pool_made, held, frame_pool_held);
}

static PyObject *
frame_buffer(PyObject *module, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "frame_buffer: a negative size");
        return NULL;
    }
    /* (n == 0 gives the shared empty bytes: a view of no bytes cannot write to it) */
    PyObject *b = new_frame_bytes(n);
    if (b == NULL)
        return NULL;
    PyObject *view = PyMemoryView_FromMemory(PyBytes_AS_STRING(b), n, n ? PyBUF_WRITE : PyBUF_READ);
    if (view == NULL) {
        Py_DECREF(b);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(2, b, view);
    Py_DECREF(b);
    Py_DECREF(view);
    return out;
}

static PyMethodDef methods[] = {
    {"frame_buffer", frame_buffer, METH_O, frame_buffer_doc},
    {"frame_pool", frame_pool_py, METH_VARARGS, frame_pool_doc},
    {"sparse_runs", (PyCFunction)(void (*)(void))sparse_runs, METH_VARARGS | METH_KEYWORDS, sparse_runs_doc},
    {"decode_sparse", (PyCFunction)(void (*)(void))decode_sparse, METH_VARARGS | METH_KEYWORDS, decode_sparse_doc},
    {"crc32", (PyCFunction)(void (*)(void))crc32_py, METH_FASTCALL, crc32_doc},
    {"bind", bind, METH_VARARGS, bind_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "bookie._records",
    "The reader's record walks (bookie.entry.sparse_runs, decode_sparse) and CRC-32, in C.", -1, methods,
};

PyMODINIT_FUNC
PyInit__records(void)
{
    make_tables();
#ifdef HAVE_CLMUL
    __builtin_cpu_init();
    if (__builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1"))
        crc_best = !__builtin_cpu_supports("vpclmulqdq") ? CRC_CLMUL
                   : __builtin_cpu_supports("avx512f") ? CRC_VPCLMUL
                   : __builtin_cpu_supports("avx2") ? CRC_VPCLMUL256 : CRC_CLMUL;
#endif
    /* BOOKSTREAM_CRC_WAY=N: a way below the best this machine has (an A/B
     * of the ways with the same command; a CPU whose wide way misbehaves) */
    const char *want = getenv("BOOKSTREAM_CRC_WAY");
    if (want != NULL && *want != '\0') {
        char *end;
        long w = strtol(want, &end, 10);
        if (*end != '\0' || w < 0 || w > crc_best) {
            PyErr_Format(PyExc_ValueError, "BOOKSTREAM_CRC_WAY=%s: this machine has ways 0..%d", want, crc_best);
            return NULL;
        }
        crc_best = (int)w;
    }
    PyObject *array = PyImport_ImportModule("array");
    if (array == NULL)
        return NULL;
    ArrayType = PyObject_GetAttrString(array, "array");
    Py_DECREF(array);
    if (ArrayType == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    if (PyModule_AddStringConstant(m, "CRC", crc_names[crc_best]) < 0 || PyModule_AddIntConstant(m, "CRC_WAY", crc_best) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
