/* bookie._spans: walks of a bookie's index in C: a striped bookie's stripe
 * view (bookie/striped_read.py StripeView.fill), where a run's records
 * stop following each other on disk (bookie/index.py Run.breaks_after), and
 * a ledger's runs as a checkpoint stores them (LedgerIndex.runs_image).
 * Each runs on the bookie's event loop, over as much of the index as it is
 * asked: a striped ledger's index is a run per Qw ids, a Python step per run
 * or per id there held the loop for seconds on long streams.
 *
 * A striped bookie's share of a ledger is one gapped run (bookie/index.py:
 * it lists its ids); gapped_image writes one as the consecutive runs of a
 * checkpoint's image.
 *
 * A view holds, for one (stripe, residues) filter, the ids a bookie holds
 * with their locations and lengths in flat arrays, built from the ledger's
 * index runs when a catch-up's second frame asks for it.  Built in Python,
 * id by id, it took about 600 ns an id: 78 ms for the 131,072 ids of a
 * bookie of an E4 Qw2 stream of 256 MiB of 1 KiB entries, during which the
 * bookie's event loop answered nothing (adds included).  Here it is one pass
 * over the runs' arrays, with no Python object per id; the same pass extends
 * a view by the ids appended at the ledger's end.  It makes what the Python
 * extend makes (tests/test_striped_index.py compares both), which
 * bookie/striped_read.py runs where this module was not built.
 *
 * A striped read's short arc (E5 Qw3: a bookie asked for two of the three
 * residues it holds) sends its records with gaps between them, a piece per
 * two records at 1 KiB.  piece_bounds cuts a view's span into those pieces
 * and gather reads the span and packs them, so a frame's pieces cost no
 * Python object each (in Python, their bounds, slices and join were a third
 * of such a bookie's CPU; issue 18).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char *p;
    Py_ssize_t len, cap;   /* in bytes */
} Buf;

static int
buf_put(Buf *b, const void *v, Py_ssize_t n)
{
    if (b->len + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        char *p = PyMem_Realloc(b->p, (size_t)cap);
        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, v, (size_t)n);
    b->len += n;
    return 0;
}

/* A run's array as a buffer of `itemsize` items, or an error. */
static int
run_array(PyObject *arr, const char *name, Py_ssize_t itemsize, Py_buffer *view)
{
    if (PyObject_GetBuffer(arr, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->itemsize != itemsize) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_TypeError, "a run's %s must have items of %zd bytes", name, itemsize);
        return -1;
    }
    return 0;
}

typedef struct {
    PyObject *obj;
    const char *name;
    Py_ssize_t itemsize;
} ArrayArg;

/* run_array of each of `n` arguments into views[k]; on an error, those got
 * are released. */
static int
run_arrays(const ArrayArg *args, int n, Py_buffer *views)
{
    for (int k = 0; k < n; k++)
        if (run_array(args[k].obj, args[k].name, args[k].itemsize, &views[k]) < 0) {
            while (k-- > 0)
                PyBuffer_Release(&views[k]);
            return -1;
        }
    return 0;
}

static void
release_arrays(Py_buffer *views, int n)
{
    for (int k = 0; k < n; k++)
        PyBuffer_Release(&views[k]);
}

/* The slots' offsets of one class whose `start`, `locs`, `lens` (and
 * `ids`, if it has that slot) are __slots__ (bookie.index.Run), found once:
 * a window of runs of Qw ids made three attribute lookups a run most of a
 * build. */
static PyTypeObject *slot_type;
static Py_ssize_t slot_off[4];   /* slot_off[3] -1: no `ids` slot */

static int
member_offset(PyTypeObject *type, PyObject *name, Py_ssize_t *off)
{
    PyObject *d = PyObject_GetAttr((PyObject *)type, name);
    if (d == NULL) {
        PyErr_Clear();
        return 0;
    }
    int member = Py_IS_TYPE(d, &PyMemberDescr_Type) && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX &&
                 ((PyMemberDescrObject *)d)->d_common.d_type == type;
    if (member)
        *off = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    return member;
}

static void
find_slots(PyTypeObject *type, PyObject *const names[4])
{
    Py_ssize_t off[4] = {-1, -1, -1, -1};
    for (int i = 0; i < 3; i++)
        if (!member_offset(type, names[i], &off[i]))
            return;
    member_offset(type, names[3], &off[3]);
    Py_XSETREF(slot_type, (PyTypeObject *)Py_NewRef(type));
    memcpy(slot_off, off, sizeof off);
}

/* A run's (start, locs, lens, ids): a bookie.index.Run or such a tuple
 * (new references; *ids NULL for a run of consecutive ids: no `ids`, or
 * None). */
static int
run_parts(PyObject *run, PyObject **start, PyObject **locs, PyObject **lens, PyObject **ids)
{
    static PyObject *s_start, *s_locs, *s_lens, *s_ids;
    *ids = NULL;
    if (Py_TYPE(run) == slot_type) {
        PyObject *got[3] = {*(PyObject **)((char *)run + slot_off[0]), *(PyObject **)((char *)run + slot_off[1]),
                            *(PyObject **)((char *)run + slot_off[2])};
        PyObject *gi = slot_off[3] >= 0 ? *(PyObject **)((char *)run + slot_off[3]) : Py_None;
        if (got[0] != NULL && got[1] != NULL && got[2] != NULL && gi != NULL) {
            *start = Py_NewRef(got[0]);
            *locs = Py_NewRef(got[1]);
            *lens = Py_NewRef(got[2]);
            *ids = gi == Py_None ? NULL : Py_NewRef(gi);
            return 0;
        }   /* (a slot unset: the attribute lookups below raise AttributeError) */
    }
    if (PyTuple_Check(run)) {
        Py_ssize_t n = PyTuple_GET_SIZE(run);
        if (n != 3 && n != 4) {
            PyErr_SetString(PyExc_ValueError, "a run as a tuple is (start, locs, lens) or (start, locs, lens, ids)");
            return -1;
        }
        *start = Py_NewRef(PyTuple_GET_ITEM(run, 0));
        *locs = Py_NewRef(PyTuple_GET_ITEM(run, 1));
        *lens = Py_NewRef(PyTuple_GET_ITEM(run, 2));
        if (n == 4 && PyTuple_GET_ITEM(run, 3) != Py_None)
            *ids = Py_NewRef(PyTuple_GET_ITEM(run, 3));
        return 0;
    }
    if (s_start == NULL && ((s_start = PyUnicode_InternFromString("start")) == NULL ||
                            (s_locs = PyUnicode_InternFromString("locs")) == NULL ||
                            (s_lens = PyUnicode_InternFromString("lens")) == NULL ||
                            (s_ids = PyUnicode_InternFromString("ids")) == NULL))
        return -1;
    if (Py_TYPE(run) != slot_type && PyType_HasFeature(Py_TYPE(run), Py_TPFLAGS_HEAPTYPE)) {   /* (a class) */
        PyObject *const names[4] = {s_start, s_locs, s_lens, s_ids};
        find_slots(Py_TYPE(run), names);
    }
    *locs = *lens = NULL;
    if ((*start = PyObject_GetAttr(run, s_start)) == NULL || (*locs = PyObject_GetAttr(run, s_locs)) == NULL ||
        (*lens = PyObject_GetAttr(run, s_lens)) == NULL) {
        Py_XDECREF(*start);
        Py_XDECREF(*locs);
        return -1;
    }
    PyObject *i = PyObject_GetAttr(run, s_ids);
    if (i == NULL && PyErr_ExceptionMatches(PyExc_AttributeError))
        PyErr_Clear();   /* (no `ids`: consecutive) */
    else if (i == NULL) {
        Py_DECREF(*start);
        Py_DECREF(*locs);
        Py_DECREF(*lens);
        return -1;
    }
    if (i == Py_None)
        Py_CLEAR(i);
    *ids = i;
    return 0;
}

/* A run's start (an entry id: >= 0) and its arrays as buffers of as many
 * items (released by the caller; `vi` only where *gapped is set: a run
 * listing its ids), or an error. */
static int
run_views(PyObject *run, long long *start, Py_buffer *vl, Py_buffer *vn, Py_buffer *vi, int *gapped)
{
    PyObject *start_obj, *locs_obj, *lens_obj, *ids_obj;
    *gapped = 0;
    if (run_parts(run, &start_obj, &locs_obj, &lens_obj, &ids_obj) < 0)
        return -1;
    *start = PyLong_AsLongLong(start_obj);
    Py_DECREF(start_obj);
    int got = 0, want = ids_obj != NULL ? 3 : 2;
    if (*start < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "a run's start must be an entry id (>= 0)");
    else if (!PyErr_Occurred() && run_array(locs_obj, "locs", 8, vl) == 0) {
        got = 1;
        if (run_array(lens_obj, "lens", 4, vn) == 0) {
            got = 2;
            if (ids_obj != NULL && run_array(ids_obj, "ids", 8, vi) == 0)
                got = 3;
        }
    }
    Py_DECREF(locs_obj);
    Py_DECREF(lens_obj);
    Py_XDECREF(ids_obj);
    if (got == want && (vn->len / 4 != vl->len / 8 || vl->len / 8 > UINT32_MAX || (want == 3 && vi->len != vl->len))) {
        PyErr_SetString(PyExc_ValueError, "a run's locs, lens (and ids) differ in length (or pass 2^32 entries)");
        if (want == 3)
            PyBuffer_Release(vi);
        got = 2;
        want = -1;
    }
    if (got == want) {
        *gapped = want == 3;
        return 0;
    }
    if (got >= 2)
        PyBuffer_Release(vn);
    if (got >= 1)
        PyBuffer_Release(vl);
    return -1;
}

/* The first position k of ids[0..n) with ids[k] >= id (ascending ids). */
static Py_ssize_t
lower_bound(const int64_t *ids, Py_ssize_t n, long long id)
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

PyDoc_STRVAR(stripe_fill_doc,
"stripe_fill(runs, stripe, want, gap_bytes, count, total, prev, first, max_ids, lookup=None)\n"
"    -> (ids, locs, lens, ends, seams, breaks, stop)\n\n"
"What StripeView.extend (bookie/striped_read.py) appends to a view's arrays for\n"
"the ids of `runs` (bookie.index.Run or (start, locs array('Q'), lens\n"
"array('I')[, ids array('q')]): consecutive ids from start, or with ids a\n"
"gapped run's), ascending, above every id of the view) from `first` on whose\n"
"residue mod `stripe` is wanted (`want`: bytes, one per residue, nonzero =\n"
"wanted), the view holding `count` ids of `total` bytes, its last ending at\n"
"`prev` on disk: the bytes of array('q'), ('Q'), ('I'), ('Q'), ('q'), ('q') to\n"
"append.  It walks at most `max_ids` ids of the runs (wanted or not; -1: no\n"
"bound): `stop` is the id it stopped at, -1 when it walked every run.  `runs`\n"
"may be any iterable; with `lookup` (a dict) its items are keys, each run\n"
"`lookup[key]` (a window's runs straight from the index's SortedDict and its\n"
"keys' islice: no list of them made first).");

/* Room for `n` items of `size` bytes, so a build of a known bound grows no buffer. */
static int
buf_reserve(Buf *b, Py_ssize_t n, Py_ssize_t size)
{
    if (n <= 0 || b->cap >= n * size)
        return 0;
    char *p = PyMem_Realloc(b->p, (size_t)(n * size));
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = n * size;
    return 0;
}

static PyObject *
stripe_fill(PyObject *self, PyObject *args)
{
    PyObject *runs, *lookup = Py_None, *it = NULL, *out = NULL;
    Py_buffer want;
    Py_ssize_t stripe;
    long long k, first, max_ids, stop = -1;       /* k: ids in the view so far */
    unsigned long long gap, total, prev;   /* bytes so far; where the last record ends on disk */
    Buf ids = {0}, locs = {0}, lens = {0}, ends = {0}, seams = {0}, breaks = {0};

    (void)self;
    if (!PyArg_ParseTuple(args, "Ony*KLKKLL|O:stripe_fill", &runs, &stripe, &want, &gap, &k, &total, &prev, &first,
                          &max_ids, &lookup))
        return NULL;
    if (stripe <= 0 || want.len != stripe || k < 0) {
        PyErr_SetString(PyExc_ValueError, "a stripe > 0, one byte of want per residue, a count >= 0");
        goto done;
    }
    if (lookup != Py_None && !PyDict_Check(lookup)) {
        PyErr_SetString(PyExc_TypeError, "lookup must be a dict (the index's runs by first id) or None");
        goto done;
    }
    it = PyObject_GetIter(runs);
    if (it == NULL)
        goto done;
    Py_ssize_t bound = max_ids < 0 ? 0 : max_ids < (1 << 16) ? (Py_ssize_t)max_ids : (1 << 16);
    if (buf_reserve(&ids, bound, 8) < 0 || buf_reserve(&locs, bound, 8) < 0 || buf_reserve(&lens, bound, 4) < 0 ||
        buf_reserve(&ends, bound, 8) < 0)
        goto done;
    const char *wanted = want.buf;
    long long walked = 0;
    PyObject *item;
    while (stop < 0 && (item = PyIter_Next(it)) != NULL) {
        long long start;
        Py_buffer vl, vn, vi;
        int gapped;
        PyObject *run = item;
        if (lookup != Py_None && (run = PyDict_GetItemWithError(lookup, item)) == NULL) {   /* (borrowed) */
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, item);
            Py_DECREF(item);
            goto done;
        }
        int got = run_views(run, &start, &vl, &vn, &vi, &gapped);
        Py_DECREF(item);
        if (got < 0)
            goto done;
        Py_ssize_t n = vl.len / 8;
        const uint64_t *rl = vl.buf;
        const uint32_t *rn = vn.buf;
        const int64_t *ri = gapped ? vi.buf : NULL;   /* a gapped run's ids (else start + j) */
        Py_ssize_t j = ri ? lower_bound(ri, n, first)
                          : first > start ? (Py_ssize_t)(first - start < n ? first - start : n) : 0;
        int bad = 0;
        int64_t last_e = -1;
        Py_ssize_t res = 0;   /* e mod stripe, kept as e steps (a division an id cost more than the rest) */
        for (; j < n && !bad; j++) {
            int64_t e = ri ? ri[j] : start + j;
            if (last_e >= 0 && e >= last_e && (uint64_t)e - (uint64_t)last_e < (uint64_t)stripe) {
                res += (Py_ssize_t)((uint64_t)e - (uint64_t)last_e);
                if (res >= stripe)
                    res -= stripe;
            } else
                res = (Py_ssize_t)(((e % stripe) + stripe) % stripe);
            last_e = e;
            if (walked++ == max_ids) {
                stop = e;
                break;
            }
            if (!wanted[res])
                continue;
            uint64_t loc = rl[j];
            uint32_t ln = rn[j];
            if (k && loc != prev) {
                int64_t kk = k;
                bad |= buf_put(&seams, &kk, 8);
                /* (unsigned: a record before the last one's end wraps past the gap;
                 * another segment is a location 2^OFFSET_BITS apart, never within it) */
                if (loc - prev > gap)
                    bad |= buf_put(&breaks, &kk, 8);
            }
            total += ln;
            bad |= buf_put(&ids, &e, 8) | buf_put(&locs, &loc, 8) | buf_put(&lens, &ln, 4) |
                   buf_put(&ends, &total, 8);
            prev = loc + ln;
            k++;
        }
        if (gapped)
            PyBuffer_Release(&vi);
        PyBuffer_Release(&vl);
        PyBuffer_Release(&vn);
        if (bad)
            goto done;
    }
    if (PyErr_Occurred())   /* (the iteration's own error) */
        goto done;
#define B(b) ((b).p ? (b).p : ""), (b).len   /* (y# makes None of NULL) */
    out = Py_BuildValue("(y#y#y#y#y#y#L)", B(ids), B(locs), B(lens), B(ends), B(seams), B(breaks), stop);
#undef B
done:
    Py_XDECREF(it);
    PyBuffer_Release(&want);
    PyMem_Free(ids.p);
    PyMem_Free(locs.p);
    PyMem_Free(lens.p);
    PyMem_Free(ends.p);
    PyMem_Free(seams.p);
    PyMem_Free(breaks.p);
    return out;
}

PyDoc_STRVAR(run_breaks_doc,
"run_breaks(locs, lens, first) -> bytes\n\n"
"The positions k >= max(first, 1) of a run (`locs` array('Q'), `lens`\n"
"array('I')) whose record does not begin where record k - 1 ends on disk, as\n"
"the bytes of an array('I') (bookie/index.py Run.breaks_after).");

static PyObject *
run_breaks(PyObject *self, PyObject *args)
{
    PyObject *locs_obj, *lens_obj, *out = NULL;
    Py_ssize_t first;
    Py_buffer v[2];
    Buf breaks = {0};

    (void)self;
    if (!PyArg_ParseTuple(args, "OOn:run_breaks", &locs_obj, &lens_obj, &first))
        return NULL;
    if (run_arrays((ArrayArg[]){{locs_obj, "locs", 8}, {lens_obj, "lens", 4}}, 2, v) < 0)
        return NULL;
    Py_buffer *vl = &v[0], *vn = &v[1];
    Py_ssize_t n = vl->len / 8;
    if (vn->len / 4 != n || n > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a run's locs and lens differ in length (or pass 2^32 entries)");
        goto done;
    }
    const uint64_t *l = vl->buf;
    const uint32_t *ln = vn->buf;
    for (Py_ssize_t k = first > 1 ? first : 1; k < n; k++) {
        if (l[k] != l[k - 1] + ln[k - 1]) {
            uint32_t kk = (uint32_t)k;
            if (buf_put(&breaks, &kk, 4) < 0)
                goto done;
        }
    }
    out = PyBytes_FromStringAndSize(breaks.p ? breaks.p : "", breaks.len);
done:
    release_arrays(v, 2);
    PyMem_Free(breaks.p);
    return out;
}

PyDoc_STRVAR(runs_image_doc,
"runs_image(runs) -> bytes\n\n"
"A ledger's index runs (bookie.index.Run or (start, locs array('Q'), lens\n"
"array('I'))) as a checkpoint stores them (bookie/index.py RUN_HEAD): per\n"
"run its start (u64) and count (u32), little-endian, then its locations and\n"
"lengths as stored.");

static PyObject *
runs_image(PyObject *self, PyObject *runs)
{
    PyObject *seq, *out = NULL;
    Buf image = {0};

    (void)self;
    seq = PySequence_Fast(runs, "runs must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n_runs = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t r = 0; r < n_runs; r++) {
        long long start;
        Py_buffer vl, vn, vi;
        int gapped;
        if (run_views(PySequence_Fast_GET_ITEM(seq, r), &start, &vl, &vn, &vi, &gapped) < 0)
            goto done;
        Py_ssize_t n = vl.len / 8;
        int bad = 0;
        if (gapped) {   /* (its image is its pieces': gapped_image) */
            PyBuffer_Release(&vi);
            PyBuffer_Release(&vl);
            PyBuffer_Release(&vn);
            PyErr_SetString(PyExc_ValueError, "a gapped run (listing its ids): gapped_image");
            goto done;
        }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        uint64_t s64 = (uint64_t)start;
        uint32_t c32 = (uint32_t)n;
        bad = buf_put(&image, &s64, 8) < 0 || buf_put(&image, &c32, 4) < 0 || buf_put(&image, vl.buf, vl.len) < 0 ||
                  buf_put(&image, vn.buf, vn.len) < 0;
#else   /* (bookie/index.py packs the runs itself where the arrays are not little-endian) */
        (void)start;
        (void)n;
        PyErr_SetString(PyExc_NotImplementedError, "runs_image writes the arrays' memory: little-endian only");
        bad = 1;
#endif
        PyBuffer_Release(&vl);
        PyBuffer_Release(&vn);
        if (bad)
            goto done;
    }
    out = PyBytes_FromStringAndSize(image.p ? image.p : "", image.len);
done:
    Py_DECREF(seq);
    PyMem_Free(image.p);
    return out;
}

PyDoc_STRVAR(gapped_image_doc,
"gapped_image(ids, locs, lens) -> (count, bytes)\n\n"
"A gapped run (bookie/index.py Run.ids: its ids array('q'), ascending, with\n"
"their locations array('Q') and lengths array('I')) as runs_image writes\n"
"runs: each piece of consecutive ids a run, and how many pieces.");

static PyObject *
gapped_image(PyObject *self, PyObject *args)
{
    PyObject *ids_obj, *locs_obj, *lens_obj, *out = NULL;
    Py_buffer v[3];
    Buf image = {0};

    (void)self;
    if (!PyArg_ParseTuple(args, "OOO:gapped_image", &ids_obj, &locs_obj, &lens_obj))
        return NULL;
    if (run_arrays((ArrayArg[]){{ids_obj, "ids", 8}, {locs_obj, "locs", 8}, {lens_obj, "lens", 4}}, 3, v) < 0)
        return NULL;
    Py_ssize_t n = v[0].len / 8, count = 0;
    const int64_t *ids = v[0].buf;
    const char *l = v[1].buf, *ln = v[2].buf;
    if (v[1].len / 8 != n || v[2].len / 4 != n) {
        PyErr_SetString(PyExc_ValueError, "a run's ids, locs and lens differ in length");
        goto done;
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    for (Py_ssize_t a = 0, b; a < n; a = b, count++) {
        if (ids[a] < 0 || (a && ids[a] <= ids[a - 1])) {
            PyErr_SetString(PyExc_ValueError, "a gapped run's ids must be entry ids (>= 0), ascending");
            goto done;
        }
        for (b = a + 1; b < n && ids[b] == ids[b - 1] + 1; b++)
            ;
        uint64_t s64 = (uint64_t)ids[a];
        uint32_t c32 = (uint32_t)(b - a);
        if (b - a > UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "a piece of 2^32 entries");
            goto done;
        }
        if (buf_put(&image, &s64, 8) < 0 || buf_put(&image, &c32, 4) < 0 || buf_put(&image, l + 8 * a, 8 * (b - a)) < 0 ||
            buf_put(&image, ln + 4 * a, 4 * (b - a)) < 0)
            goto done;
    }
    out = Py_BuildValue("(ny#)", count, image.p ? image.p : "", image.len);
#else
    (void)ids; (void)l; (void)ln;
    PyErr_SetString(PyExc_NotImplementedError, "gapped_image writes the arrays' memory: little-endian only");
#endif
done:
    release_arrays(v, 3);
    PyMem_Free(image.p);
    return out;
}

PyDoc_STRVAR(piece_bounds_doc,
"piece_bounds(locs, lens, seams, lo, hi, a, b, s0) -> (starts, stops, total)\n\n"
"The pieces of a stripe view's records a..b-1 (bookie/striped_read.py\n"
"StripeView: locs array('Q'), lens array('I')), cut at the seams\n"
"seams[lo:hi] (positions in a+1..b-1, ascending, array('q')): each piece's\n"
"first byte and end as offsets from s0, as the bytes of int64 arrays, and\n"
"the pieces' bytes in all.");

static PyObject *
piece_bounds(PyObject *self, PyObject *args)
{
    PyObject *locs_obj, *lens_obj, *seams_obj, *out = NULL, *starts = NULL, *stops = NULL;
    Py_ssize_t lo, hi, a, b;
    long long s0;
    Py_buffer v[3];

    (void)self;
    if (!PyArg_ParseTuple(args, "OOOnnnnL:piece_bounds", &locs_obj, &lens_obj, &seams_obj, &lo, &hi, &a, &b, &s0))
        return NULL;
    if (run_arrays((ArrayArg[]){{locs_obj, "locs", 8}, {lens_obj, "lens", 4}, {seams_obj, "seams", 8}}, 3, v) < 0)
        return NULL;
    const uint64_t *locs = v[0].buf;
    const uint32_t *lens = v[1].buf;
    const int64_t *seams = v[2].buf;
    Py_ssize_t n = v[0].len / 8, ns = v[2].len / 8, count = hi - lo + 1;
    if (v[1].len / 4 != n || a < 0 || b <= a || b > n || lo < 0 || hi < lo || hi > ns) {
        PyErr_SetString(PyExc_ValueError, "piece_bounds: records or seams out of range");
        goto done;
    }
    for (Py_ssize_t k = lo; k < hi; k++)
        if (seams[k] <= (k > lo ? seams[k - 1] : a) || seams[k] >= b) {
            PyErr_SetString(PyExc_ValueError, "piece_bounds: seams must be ascending, within a+1..b-1");
            goto done;
        }
    starts = PyBytes_FromStringAndSize(NULL, 8 * count);
    stops = PyBytes_FromStringAndSize(NULL, 8 * count);
    if (starts == NULL || stops == NULL)
        goto done;
    int64_t *st = (int64_t *)PyBytes_AS_STRING(starts), *sp = (int64_t *)PyBytes_AS_STRING(stops);
    long long total = 0;
    for (Py_ssize_t p = 0; p < count; p++) {
        Py_ssize_t first = p ? seams[lo + p - 1] : a, last = (p + 1 < count ? seams[lo + p] : b) - 1;
        int64_t start = (int64_t)locs[first] - s0, stop = (int64_t)(locs[last] + lens[last]) - s0;
        if (start < 0 || stop < start) {
            PyErr_SetString(PyExc_ValueError, "piece_bounds: a piece before s0 or ending before it begins");
            goto done;
        }
        st[p] = start;
        sp[p] = stop;
        total += stop - start;
    }
    out = Py_BuildValue("(OOL)", starts, stops, total);
done:
    Py_XDECREF(starts);
    Py_XDECREF(stops);
    release_arrays(v, 3);
    return out;
}

/* Checks pieces [starts[k], stops[k]) of a span of `length` bytes: ascending,
 * apart, inside it; their bytes in all, or -1 with an error. */
static long long
pieces_total(const int64_t *starts, const int64_t *stops, Py_ssize_t n, long long length)
{
    long long total = 0, end = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        if (starts[k] < end || stops[k] < starts[k] || stops[k] > length) {
            PyErr_SetString(PyExc_ValueError, "pieces must be ascending, apart, within the span");
            return -1;
        }
        total += stops[k] - starts[k];
        end = stops[k];
    }
    return total;
}

static int
piece_arrays(PyObject *starts_obj, PyObject *stops_obj, Py_buffer *v)
{
    if (run_arrays((ArrayArg[]){{starts_obj, "starts", 8}, {stops_obj, "stops", 8}}, 2, v) < 0)
        return -1;
    if (v[0].len != v[1].len) {
        release_arrays(v, 2);
        PyErr_SetString(PyExc_ValueError, "as many starts as stops");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(gather_doc,
"gather(fd, offset, length, starts, stops, seg) -> bytes\n\n"
"The pieces [starts[k], stops[k]) (int64 arrays, ascending, apart) of the\n"
"`length` bytes of file `fd` at `offset`, joined: one pread of the span,\n"
"the pieces packed where it was read.  OSError if the file ends first\n"
"(segment `seg` named), as bookie/journal.py pread_exactly.");

static PyObject *
gather(PyObject *self, PyObject *args)
{
    PyObject *starts_obj, *stops_obj, *seg, *out = NULL;
    int fd;
    long long offset, length;
    Py_buffer v[2];

    (void)self;
    if (!PyArg_ParseTuple(args, "iLLOOO:gather", &fd, &offset, &length, &starts_obj, &stops_obj, &seg))
        return NULL;
    if (offset < 0 || length < 0) {
        PyErr_SetString(PyExc_ValueError, "gather: a negative offset or length");
        return NULL;
    }
    if (piece_arrays(starts_obj, stops_obj, v) < 0)
        return NULL;
    const int64_t *starts = v[0].buf, *stops = v[1].buf;
    Py_ssize_t n = v[0].len / 8;
    long long total = pieces_total(starts, stops, n, length);
    if (total < 0)
        goto done;
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
    if (out == NULL)
        goto done;
    char *p = PyBytes_AS_STRING(out);
    long long got = 0;
    while (got < length) {
        ssize_t r;
        Py_BEGIN_ALLOW_THREADS
        r = pread(fd, p + got, (size_t)(length - got), (off_t)(offset + got));
        Py_END_ALLOW_THREADS
        if (r < 0 && errno == EINTR) {
            if (PyErr_CheckSignals() < 0)
                goto fail;
            continue;
        }
        if (r < 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            goto fail;
        }
        if (r == 0) {
            PyErr_Format(PyExc_OSError, "short read in segment %S at %lld: %lld of %lld bytes", seg, offset, got,
                         length);
            goto fail;
        }
        got += r;
    }
    long long at = 0;
    for (Py_ssize_t k = 0; k < n; k++) {   /* (each piece moves down or stays: dst <= src) */
        long long len = stops[k] - starts[k];
        if (at != starts[k])
            memmove(p + at, p + starts[k], (size_t)len);
        at += len;
    }
    if (_PyBytes_Resize(&out, (Py_ssize_t)total) < 0)
        out = NULL;   /* (_PyBytes_Resize freed it) */
    goto done;
fail:
    Py_CLEAR(out);
done:
    release_arrays(v, 2);
    return out;
}

PyDoc_STRVAR(cut_doc,
"cut(data, starts, stops) -> bytes\n\n"
"The pieces data[starts[k]:stops[k]] (int64 arrays, ascending, apart),\n"
"joined.");

static PyObject *
cut(PyObject *self, PyObject *args)
{
    PyObject *data_obj, *starts_obj, *stops_obj, *out = NULL;
    Py_buffer vd, v[2];

    (void)self;
    if (!PyArg_ParseTuple(args, "OOO:cut", &data_obj, &starts_obj, &stops_obj))
        return NULL;
    if (PyObject_GetBuffer(data_obj, &vd, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (piece_arrays(starts_obj, stops_obj, v) < 0) {
        PyBuffer_Release(&vd);
        return NULL;
    }
    const int64_t *starts = v[0].buf, *stops = v[1].buf;
    Py_ssize_t n = v[0].len / 8;
    long long total = pieces_total(starts, stops, n, vd.len);
    if (total >= 0 && (out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total)) != NULL) {
        char *p = PyBytes_AS_STRING(out);
        for (Py_ssize_t k = 0; k < n; k++) {
            memcpy(p, (const char *)vd.buf + starts[k], (size_t)(stops[k] - starts[k]));
            p += stops[k] - starts[k];
        }
    }
    PyBuffer_Release(&vd);
    release_arrays(v, 2);
    return out;
}

static PyMethodDef methods[] = {
    {"cut", cut, METH_VARARGS, cut_doc},
    {"gapped_image", gapped_image, METH_VARARGS, gapped_image_doc},
    {"gather", gather, METH_VARARGS, gather_doc},
    {"piece_bounds", piece_bounds, METH_VARARGS, piece_bounds_doc},
    {"stripe_fill", stripe_fill, METH_VARARGS, stripe_fill_doc},
    {"run_breaks", run_breaks, METH_VARARGS, run_breaks_doc},
    {"runs_image", runs_image, METH_O, runs_image_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "bookie._spans",
    "Walks of a bookie's index in C (bookie/index.py, bookie/striped_read.py).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__spans(void)
{
    return PyModule_Create(&module_def);
}
