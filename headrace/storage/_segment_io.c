/*
 * headrace.storage._segment_io -- the storage layer's compiled loops over segment bytes and
 * files.
 *
 * Owns the log's two hot I/O paths -- a plain produce batch validated, its base offset
 * patched and written to the segment descriptor in one call (append_plain_batch, write_batch),
 * and the cleaner's passes over a span of a segment, reading it with pread (or O_DIRECT for
 * chunks the page cache lacks: page_cache_holds, read_chunk) and writing pass 2's output to
 * the .cleaned descriptor (map_span, filter_span, each on a niced helper thread when asked) --
 * plus the cleaner's passes over a buffer (map_batches, filter_batches), its offset map's
 * Robin Hood loops (offset_map_put, offset_map_get) and segment recovery's CRC scan and index
 * rebuild (index_batches). Batches, records, CRC-32C and produce validation come from the
 * protocol layer's record_batches.h; the pause of cooperative spans reads the word described
 * in cooperative_spans.h, which the broker stores to. The Python face is
 * headrace/storage/segment_io.py.
 *
 * Thread-safety: no shared mutable state after module init (the CRC tables and variant, and
 * the page-cache probe, are set there; cachestat is dropped for mincore on its first ENOSYS)
 * except the time of the broker's latest request, one atomic word the broker's event loop
 * stores and niced cleaner spans load. Every loop and every read or write runs with the GIL
 * released over buffers the caller holds; output is collected in malloc'd buffers handed to
 * Python as read-only OwnedBuffers. Malformed input is reported as
 * headrace.errors.CorruptMessage, a failed read or write as OSError.
 */
#define KERNEL_MODULE_NAME "headrace.storage._segment_io"
#include "../protocol/record_batches.h"
#include "cooperative_spans.h"
#include <errno.h>
#include <unistd.h>
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <sys/syscall.h>
#include <sys/mman.h>

/* ---- the log cleaner's offset map: Robin Hood open addressing ------------------------
 * Slots live in two caller-owned arrays of `capacity` entries (12 bytes a slot):
 *   fingerprints uint64[capacity]: the key hash's first word (h1); 0 marks an empty slot
 *                                  (an h1 of 0 is stored as 1)
 *   words        uint32[capacity]: displacement from the home slot << OFFSET_MAP_DELTA_BITS
 *                                  | (offset - base_offset)
 * The home slot is ((h2 & 0xffffffff) * capacity) >> 32. A lookup matches a slot only if its
 * fingerprint AND its home slot (position - displacement) equal the key's, so the position
 * adds log2(capacity) bits of identity. See headrace/storage/offset_map.py for the sums. */

#define OFFSET_MAP_DELTA_BITS 26
#define OFFSET_MAP_MAX_DISPLACEMENT 63u
#define OFFSET_MAP_DELTA_MASK ((1u << OFFSET_MAP_DELTA_BITS) - 1u)

static inline uint64_t offset_map_fingerprint(uint64_t h1) { return h1 ? h1 : 1; }

static inline uint64_t offset_map_home(uint64_t h2, uint64_t capacity)
{
    return ((h2 & 0xffffffffu) * capacity) >> 32;
}

/* Insert one key; 1 on success, 0 when a displacement would exceed the maximum (the map
 * counts as full). `*size` grows when the key is new. */
static int offset_map_put_one(uint64_t *fps, uint32_t *words, uint64_t capacity, uint64_t fp,
                              uint64_t home, uint32_t delta, int64_t *size)
{
    uint64_t pos = home;
    uint32_t disp = 0;
    for (;;) {
        uint64_t slot_fp = fps[pos];
        if (slot_fp == 0) {
            fps[pos] = fp;
            words[pos] = (disp << OFFSET_MAP_DELTA_BITS) | delta;
            (*size)++;
            return 1;
        }
        uint32_t slot_disp = words[pos] >> OFFSET_MAP_DELTA_BITS;
        if (slot_fp == fp && slot_disp == disp) {
            uint32_t old = words[pos] & OFFSET_MAP_DELTA_MASK;
            if (delta > old)
                words[pos] = (disp << OFFSET_MAP_DELTA_BITS) | delta;
            return 1;
        }
        if (slot_disp < disp) { /* Robin Hood: the richer entry moves on */
            uint32_t slot_word = words[pos];
            fps[pos] = fp;
            words[pos] = (disp << OFFSET_MAP_DELTA_BITS) | delta;
            fp = slot_fp;
            disp = slot_disp;
            delta = slot_word & OFFSET_MAP_DELTA_MASK;
        }
        disp++;
        if (disp > OFFSET_MAP_MAX_DISPLACEMENT)
            return 0;
        pos = pos + 1 == capacity ? 0 : pos + 1;
    }
}

/* Returns the stored delta or -1. */
static int64_t offset_map_get_one(const uint64_t *fps, const uint32_t *words, uint64_t capacity,
                                  uint64_t fp, uint64_t home)
{
    uint64_t pos = home;
    for (uint32_t disp = 0; disp <= OFFSET_MAP_MAX_DISPLACEMENT; disp++) {
        uint64_t slot_fp = fps[pos];
        if (slot_fp == 0)
            return -1;
        uint32_t slot_disp = words[pos] >> OFFSET_MAP_DELTA_BITS;
        if (slot_disp < disp)
            return -1; /* Robin Hood invariant: the key would have displaced this entry */
        if (slot_fp == fp && slot_disp == disp)
            return words[pos] & OFFSET_MAP_DELTA_MASK;
        pos = pos + 1 == capacity ? 0 : pos + 1;
    }
    return -1;
}

typedef struct {
    Py_buffer fps, words, h1, h2, offsets;
} OffsetMapArgs;

static void offset_map_release(OffsetMapArgs *a)
{
    Py_buffer *all[] = {&a->fps, &a->words, &a->h1, &a->h2, &a->offsets};
    for (int i = 0; i < 5; i++)
        if (all[i]->obj != NULL)
            PyBuffer_Release(all[i]);
}

static int offset_map_parse(PyObject *args, OffsetMapArgs *a, int writable, long long *base,
                            long long *limit)
{
    memset(a, 0, sizeof(*a));
    int table_flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    PyObject *fps, *words, *h1, *h2, *offsets;
    if (!PyArg_ParseTuple(args, "OOOOOLL", &fps, &words, &h1, &h2, &offsets, base, limit))
        return -1;
    if (PyObject_GetBuffer(fps, &a->fps, table_flags) < 0 ||
        PyObject_GetBuffer(words, &a->words, table_flags) < 0 ||
        PyObject_GetBuffer(h1, &a->h1, PyBUF_C_CONTIGUOUS) < 0 ||
        PyObject_GetBuffer(h2, &a->h2, PyBUF_C_CONTIGUOUS) < 0 ||
        PyObject_GetBuffer(offsets, &a->offsets, PyBUF_C_CONTIGUOUS) < 0) {
        offset_map_release(a);
        return -1;
    }
    Py_ssize_t capacity = a->fps.len / 8, n = a->h1.len / 8;
    if (capacity < 1 || a->words.len != capacity * 4 || a->h2.len != n * 8 ||
        a->offsets.len != n * 8 || capacity > 0xffffffffLL) {
        offset_map_release(a);
        PyErr_SetString(PyExc_ValueError, "offset map: mismatched array sizes");
        return -1;
    }
    return 0;
}

static PyObject *py_offset_map_put(PyObject *self, PyObject *args)
{
    OffsetMapArgs a;
    long long base, room;
    if (offset_map_parse(args, &a, 1, &base, &room) < 0)
        return NULL;
    uint64_t capacity = (uint64_t)(a.fps.len / 8);
    Py_ssize_t n = a.h1.len / 8, done = 0;
    uint64_t *fps = a.fps.buf;
    uint32_t *words = a.words.buf;
    const uint64_t *h1 = a.h1.buf, *h2 = a.h2.buf;
    const int64_t *offsets = a.offsets.buf;
    int64_t added = 0;
    int full = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; done < n; done++) {
        int64_t delta = offsets[done] - base;
        if (delta < 0 || delta > (int64_t)OFFSET_MAP_DELTA_MASK || added >= room) {
            full = 1;
            break;
        }
        uint64_t fp = offset_map_fingerprint(h1[done]);
        int64_t before = added;
        if (!offset_map_put_one(fps, words, capacity, fp, offset_map_home(h2[done], capacity),
                                (uint32_t)delta, &added)) {
            full = 1;
            added = before;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    offset_map_release(&a);
    return Py_BuildValue("nLi", done, (long long)added, full);
}

static PyObject *py_offset_map_get(PyObject *self, PyObject *args)
{
    OffsetMapArgs a;
    long long base, unused;
    if (offset_map_parse(args, &a, 0, &base, &unused) < 0)
        return NULL;
    uint64_t capacity = (uint64_t)(a.fps.len / 8);
    Py_ssize_t n = a.h1.len / 8;
    PyObject *result = PyBytes_FromStringAndSize(NULL, n * 8);
    if (result == NULL) {
        offset_map_release(&a);
        return NULL;
    }
    int64_t *out = (int64_t *)PyBytes_AS_STRING(result);
    const uint64_t *fps = a.fps.buf, *h1 = a.h1.buf, *h2 = a.h2.buf;
    const uint32_t *words = a.words.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t delta = offset_map_get_one(fps, words, capacity, offset_map_fingerprint(h1[i]),
                                           offset_map_home(h2[i], capacity));
        out[i] = delta < 0 ? -1 : base + delta;
    }
    Py_END_ALLOW_THREADS
    offset_map_release(&a);
    return result;
}

/* append_plain_batch: the storage append path's common case in one call. A produce request
 * that is exactly one v2 batch needing nothing but validation and an offset -- in the
 * topic's codec (or a control batch), fitting the active segment -- is checked exactly as
 * validate_batches and first_batch_outside_limits check it (structure and CRC-32C raise
 * CorruptMessage with the same message) and written to fd with its base offset replaced, all
 * with the GIL released: (last_offset, max_timestamp, True). The caller's buffer is only read
 * (it may be bytes or a read-only memoryview of a request frame): the new 8-byte base offset,
 * the batch length, the leader's epoch stamped as partitionLeaderEpoch (bytes 12..15) and the
 * rest of the batch go out in one writev -- the CRC covers neither the base offset nor the
 * partition leader epoch.
 * A batch carrying a producer id (not a control batch) is validated alike but not written:
 * (last_offset, max_timestamp, False) -- the caller checks its sequence and then calls
 * write_batch. Anything else -- an empty request, several batches, a limit exceeded, another
 * codec, no room left in the segment, an object that is not a contiguous buffer -- is
 * declined: None, nothing written, and the caller's general path validates again and decides
 * (raising the precise error); the header alone decides that, so a declined request costs no
 * CRC here. Writes continue after short writes; EINTR runs the signal handlers and retries; a
 * failed write truncates the file back to where the batch began and raises OSError. */

typedef struct {
    int64_t base_offset, leader_epoch, max_size_bytes, max_last_offset, required_codec;
    BatchLimits batch;
    RecordChecks checks;
} PlainAppendLimits;

enum { PLAIN_DECLINED, PLAIN_WRITE, PLAIN_PRODUCER, PLAIN_CORRUPT };

/* PLAIN_WRITE, PLAIN_PRODUCER (in scope but its sequence needs checking) or PLAIN_DECLINED. */
static int plain_batch_scope(const BatchSummary *s, size_t len, const PlainAppendLimits *l)
{
    int control = s->attributes & ATTR_CONTROL;
    int codec = s->attributes & ATTR_COMPRESSION_MASK;
    int in_scope =
        s->size_bytes == (int64_t)len && s->size_bytes <= l->max_size_bytes &&
        l->base_offset + s->last_offset_delta <= l->max_last_offset &&
        !outside_limits(&l->batch, s->size_bytes, s->last_offset_delta, s->records_count,
                        s->base_timestamp, s->max_timestamp, 0) &&
        (l->required_codec < 0 || control || codec == l->required_codec);
    if (!in_scope)
        return PLAIN_DECLINED;
    return s->producer_id >= 0 && !control ? PLAIN_PRODUCER : PLAIN_WRITE;
}

static void put_be64(uint8_t *p, int64_t value)
{
    for (int i = 7; i >= 0; i--, value = (int64_t)((uint64_t)value >> 8))
        p[i] = (uint8_t)value;
}

/* Write p[*written..n) to fd; 0 when done, else errno (EINTR: call again after signals). */
static int write_fully(int fd, const uint8_t *p, size_t n, size_t *written)
{
    while (*written < n) {
        ssize_t count = write(fd, p + *written, n - *written);
        if (count < 0)
            return errno;
        *written += (size_t)count;
    }
    return 0;
}

/* Undo a partly written batch (the file ended at `end - written` before it). */
static void drop_partial_write(int fd, size_t written)
{
    off_t end = lseek(fd, 0, SEEK_END);
    if (written > 0 && end >= (off_t)written && ftruncate(fd, end - (off_t)written) < 0)
        return; /* the write's own error is the one reported */
}

/* A batch to write with its header prefix replaced: `prefix` holds the new base offset
 * (big-endian), the batch's own length and the new partition leader epoch (big-endian), then
 * buf[PREFIX_BYTES..len) follows; the caller's buffer itself is never changed. */
enum { BASE_OFFSET_BYTES = 8, LEADER_EPOCH_POSITION = 12, PREFIX_BYTES = 16 };
typedef struct {
    const uint8_t *buf;
    size_t len;
    uint8_t prefix[PREFIX_BYTES];
} PatchedBatch;

static void put_be32(uint8_t *p, int32_t value)
{
    uint32_t v = (uint32_t)value;
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8),
    p[3] = (uint8_t)v;
}

/* The prefix of buf (len >= PREFIX_BYTES) based at base_offset, stamped with leader_epoch. */
static void patch_prefix(PatchedBatch *b, int64_t base_offset, int32_t leader_epoch)
{
    put_be64(b->prefix, base_offset);
    memcpy(b->prefix + BASE_OFFSET_BYTES, b->buf + BASE_OFFSET_BYTES,
           LEADER_EPOCH_POSITION - BASE_OFFSET_BYTES);
    put_be32(b->prefix + LEADER_EPOCH_POSITION, leader_epoch);
}

/* Write bytes [*written..len) of the patched batch to fd: one writev for the new prefix and
 * the rest while the prefix is not out, then plain writes; 0 when done, else errno (EINTR:
 * call again after signals). */
static int write_patched(int fd, const PatchedBatch *b, size_t *written)
{
    while (*written < b->len) {
        ssize_t count;
        if (*written < PREFIX_BYTES) {
            struct iovec parts[2] = {
                {(void *)(b->prefix + *written), PREFIX_BYTES - *written},
                {(void *)(b->buf + PREFIX_BYTES), b->len - PREFIX_BYTES},
            };
            count = writev(fd, parts, 2);
        } else {
            count = write(fd, b->buf + *written, b->len - *written);
        }
        if (count < 0)
            return errno;
        *written += (size_t)count;
    }
    return 0;
}

/* Finish a write begun without the GIL: retry after EINTR once signal handlers ran; on
 * failure drop the partial batch and set the exception. 0 when the batch is whole. */
static int finish_write(int fd, const PatchedBatch *b, size_t *written, int error)
{
    while (error == EINTR && PyErr_CheckSignals() == 0) {
        Py_BEGIN_ALLOW_THREADS
        error = write_patched(fd, b, written);
        Py_END_ALLOW_THREADS
    }
    if (error == 0)
        return 0;
    drop_partial_write(fd, *written);
    if (error != EINTR) { /* EINTR: the signal handler's exception is already set */
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
    }
    return -1;
}

static int plain_validate(const uint8_t *buf, size_t len, const PlainAppendLimits *l,
                          BatchSummary *s, Failure *f)
{
    if (len < BATCH_HEADER_BYTES)
        return PLAIN_DECLINED;
    summarize_header(buf, 0, s); /* decline before the CRC: the general path checks anyway */
    int scope = plain_batch_scope(s, len, l);
    if (scope == PLAIN_DECLINED)
        return PLAIN_DECLINED;
    RecordErrors errs = {{NULL, 0, 0}, -1, 0};
    int status = validate_one(NULL, buf, len, 0, &l->checks, &errs, s, f);
    free(errs.errors.data);
    if (status < 0) /* a record-level refusal: the general path names it */
        return f->kind == FAIL_CORRUPT ? PLAIN_CORRUPT : PLAIN_DECLINED;
    /* Compressed records, a max timestamp to rewrite: the caller finishes the batch. */
    if (scope == PLAIN_WRITE && ((s->attributes & ATTR_COMPRESSION_MASK) ||
                                 needs_max_timestamp_rewrite(buf, s->max_timestamp)))
        return PLAIN_PRODUCER;
    return scope;
}

static int fd_argument(PyObject *arg, int *fd)
{
    long fd_number = PyLong_AsLong(arg);
    if (fd_number == -1 && PyErr_Occurred())
        return -1;
    if (fd_number < 0 || fd_number > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "fd out of range");
        return -1;
    }
    *fd = (int)fd_number;
    return 0;
}

static int plain_append_args(PyObject *const *args, Py_ssize_t nargs, PlainAppendLimits *l,
                             int *fd)
{
    if (nargs != 8 || !PyTuple_Check(args[7]) || PyTuple_GET_SIZE(args[7]) != 6) {
        PyErr_SetString(PyExc_TypeError, "append_plain_batch(buf, fd, base_offset, "
                        "leader_epoch, max_size_bytes, max_last_offset, now_ms, "
                        "(max_message_bytes, before_max_ms, after_max_ms, required_codec, "
                        "compacted, from_client))");
        return -1;
    }
    long long limits[6];
    for (Py_ssize_t i = 0; i < 6; i++)
        limits[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(args[7], i));
    l->base_offset = PyLong_AsLongLong(args[2]);
    l->leader_epoch = PyLong_AsLongLong(args[3]);
    l->max_size_bytes = PyLong_AsLongLong(args[4]);
    l->max_last_offset = PyLong_AsLongLong(args[5]);
    long long now_ms = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred() || fd_argument(args[1], fd) < 0)
        return -1;
    if (l->leader_epoch < -1 || l->leader_epoch > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "leader_epoch out of range");
        return -1;
    }
    l->batch = batch_limits(limits[0], now_ms, limits[1], limits[2]);
    l->required_codec = limits[3];
    l->checks = (RecordChecks){limits[4] != 0, 1, limits[5] != 0, l->batch.earliest_ms,
                               l->batch.latest_ms};
    return 0;
}

static PyObject *plain_result(int64_t last_offset, int64_t max_timestamp, int written)
{
    PyObject *last = PyLong_FromLongLong(last_offset);
    PyObject *max = PyLong_FromLongLong(max_timestamp);
    PyObject *result = NULL;
    if (last != NULL && max != NULL)
        result = PyTuple_Pack(3, last, max, written ? Py_True : Py_False);
    Py_XDECREF(last);
    Py_XDECREF(max);
    return result;
}

static PyObject *py_append_plain_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    PlainAppendLimits limits;
    int fd;
    if (plain_append_args(args, nargs, &limits, &fd) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear(); /* not a contiguous buffer: the general path reports it */
        Py_RETURN_NONE;
    }
    BatchSummary s = {0};
    Failure failure = {FAIL_NONE, ""};
    PatchedBatch batch = {view.buf, (size_t)view.len, {0}};
    size_t written = 0;
    int outcome, error = 0;
    Py_BEGIN_ALLOW_THREADS
    outcome = plain_validate(batch.buf, batch.len, &limits, &s, &failure);
    if (outcome == PLAIN_WRITE) {
        patch_prefix(&batch, limits.base_offset, (int32_t)limits.leader_epoch);
        error = write_patched(fd, &batch, &written);
    }
    Py_END_ALLOW_THREADS
    int status = outcome == PLAIN_WRITE ? finish_write(fd, &batch, &written, error) : 0;
    PyBuffer_Release(&view);
    if (outcome == PLAIN_CORRUPT)
        return raise_failure(&failure);
    if (outcome == PLAIN_DECLINED)
        Py_RETURN_NONE;
    if (status < 0)
        return NULL;
    return plain_result(limits.base_offset + s.last_offset_delta, s.max_timestamp,
                        outcome == PLAIN_WRITE);
}

/* write_batch(buf, fd, base_offset, leader_epoch): write the batch buf (validated by
 * append_plain_batch, sequence checked by the caller) to fd with its base offset replaced
 * and leader_epoch stamped, GIL released, buf only read; the same writev, EINTR and failure
 * handling. */
static PyObject *py_write_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    int fd;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "write_batch(buf, fd, base_offset, leader_epoch)");
        return NULL;
    }
    long long base_offset = PyLong_AsLongLong(args[2]);
    if ((base_offset == -1 && PyErr_Occurred()) || fd_argument(args[1], &fd) < 0)
        return NULL;
    long long leader_epoch = PyLong_AsLongLong(args[3]);
    if (leader_epoch == -1 && PyErr_Occurred())
        return NULL;
    if (leader_epoch < -1 || leader_epoch > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "leader_epoch out of range");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.len < PREFIX_BYTES) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "write_batch: buffer shorter than a batch header");
        return NULL;
    }
    PatchedBatch batch = {view.buf, (size_t)view.len, {0}};
    size_t written = 0;
    int error;
    patch_prefix(&batch, base_offset, (int32_t)leader_epoch);
    Py_BEGIN_ALLOW_THREADS
    error = write_patched(fd, &batch, &written);
    Py_END_ALLOW_THREADS
    int status = finish_write(fd, &batch, &written, error);
    PyBuffer_Release(&view);
    if (status < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ segment recovery */
/* index_batches: recovery's scan of a segment's .log -- and the index rebuild after the
 * cleaner swaps a segment in -- in one call per chunk: walk the batches from a known batch
 * boundary, stop at the first invalid one (short or implausible header, magic other than 2,
 * an offset going backwards, a batch past the end of the file, a CRC-32C mismatch) and
 * compute the offset and time index entries the segment's append path would have written
 * (one per index.interval.bytes, Kafka's rule). Chunk state passes through IndexState. */

typedef struct {
    int64_t bytes_since_last_entry, max_timestamp, offset_of_max_timestamp;
    int64_t last_time_entry; /* the time index's last timestamp, if has_time_entry */
    int has_time_entry;
} IndexState;

typedef struct {
    const uint8_t *buf;
    size_t len;
    int64_t buffer_position, file_size, min_base_offset, interval_bytes;
} IndexInput;

typedef struct {
    size_t consumed;
    int64_t next_offset, first_max_timestamp;
    int stopped, has_first;
    IndexState state;
    Buf offset_entries, time_entries, positions; /* int64 pairs, pairs, singles */
} IndexScan;

/* 1 if the whole batch at pos is valid, 0 if it is not (the log ends before it), 2 if it
 * runs past the end of the buffer but not of the file (more bytes are needed). */
static int index_batch_is_valid(const IndexInput *in, size_t pos, int64_t next_offset)
{
    const uint8_t *p = in->buf + pos;
    int32_t batch_length = (int32_t)be32(p + 8);
    if (p[16] != CURRENT_MAGIC || batch_length < BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES)
        return 0;
    int64_t size_bytes = (int64_t)batch_length + LOG_OVERHEAD_BYTES;
    int64_t base_offset = (int64_t)be64(p);
    int64_t lowest = next_offset > in->min_base_offset ? next_offset : in->min_base_offset;
    if (base_offset < lowest || in->buffer_position + (int64_t)pos + size_bytes > in->file_size)
        return 0;
    if ((size_t)size_bytes > in->len - pos)
        return 2;
    uint32_t crc = ~crc32c_fast_update(~0u, p + CRC_COVERED_FROM,
                                       (size_t)size_bytes - CRC_COVERED_FROM);
    return crc == be32(p + 17);
}

/* The segment append path's index rule for one valid batch at pos. */
static int index_one_batch(const IndexInput *in, IndexScan *out, size_t pos, int64_t size_bytes,
                           int64_t last_offset, int64_t max_timestamp)
{
    IndexState *st = &out->state;
    if (max_timestamp > st->max_timestamp) {
        st->max_timestamp = max_timestamp;
        st->offset_of_max_timestamp = last_offset;
    }
    if (st->bytes_since_last_entry > in->interval_bytes) {
        int64_t entry[2] = {last_offset, in->buffer_position + (int64_t)pos};
        if (buf_put(&out->offset_entries, entry, sizeof entry))
            return -1;
        /* Kafka's TimeIndex.maybeAppend: an empty index's last entry is (NO_TIMESTAMP, base),
         * so batches without a timestamp (-1) never get an entry. */
        if (st->max_timestamp > (st->has_time_entry ? st->last_time_entry : NO_TIMESTAMP)) {
            int64_t time_entry[2] = {st->max_timestamp, st->offset_of_max_timestamp};
            if (buf_put(&out->time_entries, time_entry, sizeof time_entry))
                return -1;
            st->last_time_entry = st->max_timestamp;
            st->has_time_entry = 1;
        }
        st->bytes_since_last_entry = 0;
    }
    st->bytes_since_last_entry += size_bytes;
    int64_t position = (int64_t)pos;
    return buf_put(&out->positions, &position, sizeof position);
}

static int index_batches(const IndexInput *in, IndexScan *out, Failure *f)
{
    size_t pos = 0;
    while (in->len - pos >= BATCH_HEADER_BYTES) {
        int valid = index_batch_is_valid(in, pos, out->next_offset);
        if (valid != 1) {
            out->stopped = valid == 0;
            break;
        }
        const uint8_t *p = in->buf + pos;
        int64_t size_bytes = (int64_t)be32(p + 8) + LOG_OVERHEAD_BYTES;
        int64_t last_offset = (int64_t)((uint64_t)be64(p) + (uint64_t)(int64_t)(int32_t)be32(p + 23));
        int64_t max_timestamp = (int64_t)be64(p + 35);
        if (!out->has_first) {
            out->first_max_timestamp = max_timestamp;
            out->has_first = 1;
        }
        if (index_one_batch(in, out, pos, size_bytes, last_offset, max_timestamp))
            return fail_no_memory(f);
        out->next_offset = last_offset + 1;
        pos += (size_t)size_bytes;
    }
    out->consumed = pos;
    return 0;
}

static PyObject *py_index_batches(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer view;
    IndexInput in;
    IndexScan out;
    Failure failure = {FAIL_NONE, ""};
    memset(&out, 0, sizeof out);
    if (!PyArg_ParseTuple(args, "y*LLLLL(LLLLp)", &view, &in.buffer_position, &in.file_size,
                          &in.min_base_offset, &out.next_offset, &in.interval_bytes,
                          &out.state.bytes_since_last_entry, &out.state.max_timestamp,
                          &out.state.offset_of_max_timestamp, &out.state.last_time_entry,
                          &out.state.has_time_entry))
        return NULL;
    in.buf = view.buf;
    in.len = (size_t)view.len;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = index_batches(&in, &out, &failure);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    Buf outputs[3] = {out.offset_entries, out.time_entries, out.positions};
    PyObject *buffers = outputs_or_raise(outputs, 3, status, &failure);
    if (buffers == NULL)
        return NULL;
    const IndexState *st = &out.state;
    return Py_BuildValue("nLiOL(LLLLi)N", (Py_ssize_t)out.consumed, (long long)out.next_offset,
                         out.stopped, out.has_first ? Py_True : Py_False,
                         (long long)out.first_max_timestamp,
                         (long long)st->bytes_since_last_entry, (long long)st->max_timestamp,
                         (long long)st->offset_of_max_timestamp, (long long)st->last_time_entry,
                         st->has_time_entry, buffers);
}

/* ---- the log cleaner's passes over whole batches -------------------------------------
 * Both passes identify a record of the dirty section [first_offset, end_offset) by its
 * ordinal: the count of keyed, non-control records of this pass's hash range (h2 >> 32 in
 * [range_low, range_high)) that precede it in the dirty section. Pass 1 maps key -> latest
 * ordinal (so one pass covers 2**26 of its own records, whatever the offset span); pass 2
 * walks the same records in the same order, counting ordinals again, and keeps a record iff
 * it has a key and is outside the range, or its key is unmapped, or its ordinal is the
 * mapped one -- unless it is a tombstone whose batch's delete horizon has passed. */

#define ATTR_DELETE_HORIZON 0x40
#define ATTR_TRANSACTIONAL 0x10
#define DECISION_KEEP 1
#define DECISION_TOMBSTONE 2
#define FILTER_OUT_SLACK_BYTES 4096 /* rebuilt batches may grow a little (rebased deltas) */
#define PRODUCER_ID_AT 43

typedef struct {
    uint64_t *fps;
    uint32_t *words;
    uint64_t capacity;
    int64_t first_offset, end_offset; /* the dirty section */
    uint64_t range_low, range_high;   /* of h2 >> 32 */
    int64_t next_ordinal;             /* of the next dirty in-range record */
    /* aborted transactions, (producer_id, first_offset, last_offset) triples sorted by
     * producer id then first offset: their data batches below end_offset are removed
     * (Kafka's CleanedTransactionMetadata), never mapped, never numbered */
    const int64_t *aborted;
    Py_ssize_t aborted_count;
} PassScope;

/* 1 if the batch is data of an aborted transaction: transactional, not control, and its
 * base offset within [first_offset, last_offset] of one of its producer's aborts. */
static int batch_is_aborted(const PassScope *s, const Batch *b)
{
    if (s->aborted_count == 0 || !(b->attributes & ATTR_TRANSACTIONAL) ||
        (b->attributes & ATTR_CONTROL))
        return 0;
    Py_ssize_t low = 0, high = s->aborted_count;
    while (low < high) {
        Py_ssize_t middle = low + (high - low) / 2;
        if (s->aborted[3 * middle] < b->producer_id)
            low = middle + 1;
        else
            high = middle;
    }
    for (Py_ssize_t i = low; i < s->aborted_count && s->aborted[3 * i] == b->producer_id; i++)
        if (s->aborted[3 * i + 1] <= b->base_offset && b->base_offset <= s->aborted[3 * i + 2])
            return 1;
    return 0;
}

/* 1 if the key's h2 places it in this pass's hash range. */
static int pass_in_range(const PassScope *s, const uint64_t hash[2])
{
    uint64_t value = hash[1] >> 32;
    return value >= s->range_low && value < s->range_high;
}

static int pass_is_dirty(const PassScope *s, int64_t offset)
{
    return offset >= s->first_offset && offset < s->end_offset;
}

/* ---- probes ahead of use
 * A map probe is a cache (and TLB) miss in a table of up to 128 MiB: the passes hash a
 * record's key, prefetch its home slot and queue the probe, and run it PROBE_AHEAD_RECORDS
 * records later, when the slot has arrived; the misses of that many records overlap. */

#define PROBE_AHEAD_RECORDS 16

typedef struct {
    uint64_t fp, home;
    int64_t ordinal; /* pass 1: the value to store; pass 2: -1 outside the dirty section */
    int64_t tag;     /* pass 1: records read up to this one; pass 2: the decision's index */
} QueuedProbe;

typedef struct {
    QueuedProbe slots[PROBE_AHEAD_RECORDS];
    int head, count;
} ProbeQueue;

static void prefetch_slot(const PassScope *s, uint64_t home)
{
    __builtin_prefetch(&s->fps[home], 1, 0);
    __builtin_prefetch(&s->words[home], 1, 0);
}

/* Queue a probe; when the queue was full, the oldest comes out in *due (returns 1). */
static int queue_probe(ProbeQueue *q, const QueuedProbe *probe, QueuedProbe *due)
{
    int tail = (q->head + q->count) % PROBE_AHEAD_RECORDS;
    if (q->count < PROBE_AHEAD_RECORDS) {
        q->slots[tail] = *probe;
        q->count++;
        return 0;
    }
    *due = q->slots[q->head];
    q->slots[q->head] = *probe;
    q->head = (q->head + 1) % PROBE_AHEAD_RECORDS;
    return 1;
}

static int dequeue_probe(ProbeQueue *q, QueuedProbe *due)
{
    if (q->count == 0)
        return 0;
    *due = q->slots[q->head];
    q->head = (q->head + 1) % PROBE_AHEAD_RECORDS;
    q->count--;
    return 1;
}

/* ---- pass 1: key -> latest ordinal */

typedef struct {
    PassScope scope;
    int64_t room; /* new keys the map may still take */
    int64_t added, records_read;
    int full;
    ProbeQueue queue;
} MapBuild;

/* Insert a queued key; on a full map, winds the counters back to that record. */
static int map_build_insert(MapBuild *m, const QueuedProbe *probe)
{
    if (m->added < m->room && offset_map_put_one(m->scope.fps, m->scope.words, m->scope.capacity,
                                                 probe->fp, probe->home, (uint32_t)probe->ordinal,
                                                 &m->added))
        return 0;
    m->full = 1;
    m->scope.next_ordinal = probe->ordinal + 1;
    m->records_read = probe->tag;
    return 1;
}

static int visit_map_build(void *state, const Batch *b, const Record *r, Failure *f)
{
    (void)f;
    MapBuild *m = state;
    m->records_read++;
    if (r->key.len < 0 || !pass_is_dirty(&m->scope, record_offset(b, r)) ||
        batch_is_aborted(&m->scope, b))
        return 0;
    uint64_t hash[2];
    murmur3_x64_128(r->key.data, (size_t)r->key.len, 0, hash);
    if (!pass_in_range(&m->scope, hash))
        return 0;
    QueuedProbe probe = {offset_map_fingerprint(hash[0]),
                         offset_map_home(hash[1], m->scope.capacity), m->scope.next_ordinal++,
                         m->records_read};
    if (probe.ordinal > (int64_t)OFFSET_MAP_DELTA_MASK) {
        QueuedProbe due;
        while (dequeue_probe(&m->queue, &due))
            if (map_build_insert(m, &due))
                return 1;
        m->full = 1;
        return 1;
    }
    prefetch_slot(&m->scope, probe.home);
    QueuedProbe due;
    return queue_probe(&m->queue, &probe, &due) ? map_build_insert(m, &due) : 0;
}

/* Insert the keys still queued at the end of a walk; 1 if the map filled. */
static int map_build_drain(MapBuild *m)
{
    QueuedProbe due;
    while (dequeue_probe(&m->queue, &due))
        if (map_build_insert(m, &due))
            return 1;
    return 0;
}

/* ---- pass 2: transaction markers (Kafka's CleanedTransactionMetadata)
 * Pass 2 walks the log from its start in offset order; per producer id it notes whether a
 * transactional data batch (an emptied one too) was seen since the producer's last marker.
 * A commit or abort marker can be discarded once no data of its transaction remains: when
 * no such batch of its producer was seen since the producer's previous marker (Kafka tells
 * aborted from committed data by the aborted-transaction index; one bit per producer judges
 * alike on a well-formed log and never drops a marker whose data remains, whatever the
 * index still lists); an emptied control batch always. Such a marker gets its delete
 * horizon (KIP-534: DELETE_HORIZON_BIT, base timestamp = new_horizon_ms) in the first
 * cleaning that finds it discardable, and is removed by a cleaning at or after that
 * horizon -- unless it is its producer's last record at the producer's epoch
 * (protected_markers: Kafka keeps it for fencing) or the last batch below end_offset. The
 * table outlives one call: the caller passes the same one to every call of a rewrite. A full
 * table answers "seen" (the marker stays). Capacity 0: markers are copied. */

#define MARKER_TXN_DATA 1
#define CONTROL_TYPE_ABORT 0
#define CONTROL_TYPE_COMMIT 1
#define PRODUCER_EPOCH_AT 51

typedef struct {
    int64_t *slots;    /* pairs: producer id + 1 (0: empty slot), MARKER_TXN_DATA */
    uint64_t capacity; /* a power of two, or 0 */
    const int64_t *protected_markers; /* (producer id, epoch) pairs sorted by producer id */
    Py_ssize_t protected_count;
} TxnMarkers;

/* The producer's bits in the table (inserted, clear, when new); NULL when the table is off
 * or full, or for a producer id no producer has (negative, or too large to store + 1). */
static int64_t *marker_bits(TxnMarkers *t, int64_t producer_id)
{
    if (t->capacity == 0 || producer_id < 0 || producer_id == INT64_MAX)
        return NULL;
    uint64_t mask = t->capacity - 1;
    uint64_t slot = ((uint64_t)producer_id * 0x9E3779B97F4A7C15ULL) >> 17 & mask;
    for (uint64_t probes = 0; probes < t->capacity; probes++, slot = (slot + 1) & mask) {
        int64_t *entry = t->slots + 2 * slot;
        if (entry[0] == 0) {
            entry[0] = producer_id + 1;
            entry[1] = 0;
        }
        if (entry[0] == producer_id + 1)
            return entry + 1;
    }
    return NULL;
}

/* 1 if the marker is the last record of its producer, at the producer's epoch. */
static int marker_is_protected(const TxnMarkers *t, int64_t producer_id, int16_t epoch)
{
    Py_ssize_t low = 0, high = t->protected_count;
    while (low < high) {
        Py_ssize_t middle = low + (high - low) / 2;
        if (t->protected_markers[2 * middle] < producer_id)
            low = middle + 1;
        else
            high = middle;
    }
    return low < t->protected_count && t->protected_markers[2 * low] == producer_id &&
           t->protected_markers[2 * low + 1] == epoch;
}

/* ---- pass 2: filter batches */

typedef struct {
    const uint8_t *start; /* the record's length varint */
    const uint8_t *tail;  /* first byte after its timestamp delta */
    const uint8_t *end;
    int64_t timestamp; /* base timestamp + delta, as stored */
    uint8_t attributes;
} KeptRecord;

typedef struct {
    PassScope scope;
    int64_t now_ms, new_horizon_ms;
    const int64_t *protected_last_offsets; /* sorted: producers' last batches */
    Py_ssize_t protected_count;
    Buf out;             /* the cleaned bytes, except compressed batches to rebuild */
    Buf pending;         /* int64 quadruples: position in out, start, end in pending_batches,
                            codec */
    Buf pending_batches; /* header + uncompressed records of each compressed batch to rebuild */
    Buf kept;            /* KeptRecord of the batch at hand */
    Buf decisions;       /* uint8 per record of the non-control batches: DECISION_* bits */
    size_t decision_at;  /* the next record's decision */
    ProbeQueue queue;
    int64_t records_read, records_kept;
    TxnMarkers markers;
} BatchFilter;

static int is_protected(const BatchFilter *bf, int64_t last_offset)
{
    Py_ssize_t low = 0, high = bf->protected_count;
    while (low < high) {
        Py_ssize_t middle = low + (high - low) / 2;
        if (bf->protected_last_offsets[middle] < last_offset)
            low = middle + 1;
        else
            high = middle;
    }
    return low < bf->protected_count && bf->protected_last_offsets[low] == last_offset;
}

static void decide_by_map(BatchFilter *bf, const QueuedProbe *probe)
{
    int64_t mapped = offset_map_get_one(bf->scope.fps, bf->scope.words, bf->scope.capacity,
                                        probe->fp, probe->home);
    if (mapped < 0 || (probe->ordinal >= 0 && probe->ordinal >= mapped))
        bf->decisions.data[probe->tag] |= DECISION_KEEP;
}

/* Decide whether the record is kept; the map lookup (if one is needed) is queued and its
 * decision written PROBE_AHEAD_RECORDS records later. */
static int visit_decide(void *state, const Batch *b, const Record *r, Failure *f)
{
    BatchFilter *bf = state;
    size_t index = bf->decisions.len;
    if (put_u8(&bf->decisions, r->value.len < 0 ? DECISION_TOMBSTONE : 0))
        return fail_no_memory(f);
    if (r->key.len < 0)
        return 0;
    if (record_offset(b, r) < bf->scope.end_offset && batch_is_aborted(&bf->scope, b))
        return 0; /* aborted data: removed */
    uint64_t hash[2];
    murmur3_x64_128(r->key.data, (size_t)r->key.len, 0, hash);
    if (!pass_in_range(&bf->scope, hash)) {
        bf->decisions.data[index] |= DECISION_KEEP;
        return 0;
    }
    int64_t offset = record_offset(b, r);
    int64_t ordinal = pass_is_dirty(&bf->scope, offset) ? bf->scope.next_ordinal++ : -1;
    if (offset >= bf->scope.end_offset) {
        bf->decisions.data[index] |= DECISION_KEEP; /* past the cleanable end: untouched */
        return 0;
    }
    int expired_tombstone = r->value.len < 0 && (b->attributes & ATTR_DELETE_HORIZON) &&
                            b->base_timestamp <= bf->now_ms;
    if (expired_tombstone)
        return 0;
    QueuedProbe probe = {offset_map_fingerprint(hash[0]),
                         offset_map_home(hash[1], bf->scope.capacity), ordinal, (int64_t)index};
    prefetch_slot(&bf->scope, probe.home);
    QueuedProbe due;
    if (queue_probe(&bf->queue, &probe, &due))
        decide_by_map(bf, &due);
    return 0;
}

/* Every record's decision, in the order filter_records meets the records. */
static int decide_records(const Input *in, BatchFilter *bf, Failure *f)
{
    int status = walk_records(in, visit_decide, bf, f);
    QueuedProbe due;
    while (dequeue_probe(&bf->queue, &due))
        decide_by_map(bf, &due);
    bf->decision_at = 0;
    return status;
}

/* Where the record's bytes after its timestamp delta start (the record is valid). */
static const uint8_t *record_tail(const uint8_t *start, const uint8_t *end, uint8_t *attributes)
{
    Cursor c = {start, end};
    int32_t length;
    int64_t timestamp_delta;
    read_varint(&c, &length);
    *attributes = *c.p++;
    read_varlong(&c, &timestamp_delta);
    return c.p;
}

typedef struct {
    int32_t kept, tombstones_kept, total;
    int64_t first_timestamp, max_timestamp;
} BatchTally;

/* The record read from [start, end) of batch b, to copy into a rebuilt batch. */
static KeptRecord kept_record(const Batch *b, const Record *r, const uint8_t *start,
                              const uint8_t *end)
{
    KeptRecord k = {start, NULL, end,
                    (int64_t)((uint64_t)b->base_timestamp + (uint64_t)r->timestamp_delta), 0};
    k.tail = record_tail(start, end, &k.attributes);
    return k;
}

static int filter_records(BatchFilter *bf, const Batch *b, Cursor records, BatchTally *t,
                          Failure *f)
{
    bf->kept.len = 0;
    for (int32_t i = 0; i < b->records_count; i++) {
        const uint8_t *start = records.p;
        Record r;
        if (read_record(&records, &r))
            return fail(f, FAIL_CORRUPT, "record %d of the batch at byte %lld is malformed", (int)i,
                        (long long)b->position);
        t->total++;
        if (bf->decision_at >= bf->decisions.len)
            return fail(f, FAIL_USAGE, "more records than decisions at byte %lld",
                        (long long)b->position);
        if (!(bf->decisions.data[bf->decision_at++] & DECISION_KEEP))
            continue;
        KeptRecord k = kept_record(b, &r, start, records.p);
        if (t->kept == 0 || k.timestamp > t->max_timestamp)
            t->max_timestamp = k.timestamp;
        if (t->kept == 0)
            t->first_timestamp = k.timestamp;
        t->kept++;
        t->tombstones_kept += r.value.len < 0;
        if (buf_put(&bf->kept, &k, sizeof k))
            return fail_no_memory(f);
    }
    if (records.p != records.end)
        return fail(f, FAIL_CORRUPT, "record batch at byte %lld has %lld bytes after its records",
                    (long long)b->position, (long long)(records.end - records.p));
    return 0;
}

/* Fields a rebuilt batch header takes (the rest is copied from the original). */
typedef struct {
    int16_t attributes;
    int64_t base_timestamp, max_timestamp;
    int32_t records_count;
} NewHeader;

/* Append the batch header with `h` and the kept records, their timestamp deltas rebased on
 * h->base_timestamp; the CRC is filled in unless the records are still to be compressed. */
static int write_batch(Buf *dst, const uint8_t *raw_header, const NewHeader *h,
                       const KeptRecord *kept, int32_t kept_count, int seal, Failure *f)
{
    size_t start = dst->len;
    if (buf_put(dst, raw_header, BATCH_HEADER_BYTES))
        return fail_no_memory(f);
    for (int32_t i = 0; i < kept_count; i++) {
        const KeptRecord *k = &kept[i];
        uint64_t delta =
            zigzag64((int64_t)((uint64_t)k->timestamp - (uint64_t)h->base_timestamp));
        size_t body_bytes = 1 + uvarint_bytes(delta) + (size_t)(k->end - k->tail);
        if (body_bytes > INT32_MAX)
            return fail(f, FAIL_TOO_LARGE, "a rebuilt record exceeds %d bytes", INT32_MAX);
        if (put_uvarint(dst, (uint64_t)body_bytes << 1) || put_u8(dst, k->attributes) ||
            put_uvarint(dst, delta) || buf_put(dst, k->tail, (size_t)(k->end - k->tail)))
            return fail_no_memory(f);
    }
    size_t batch_length = dst->len - start - LOG_OVERHEAD_BYTES;
    if (batch_length > INT32_MAX)
        return fail(f, FAIL_TOO_LARGE, "a rebuilt batch exceeds %d bytes", INT32_MAX);
    uint8_t *p = dst->data + start;
    put_be32_at(p + 8, (uint32_t)batch_length);
    put_be16_at(p + 21, (uint16_t)h->attributes);
    put_be64_at(p + 27, (uint64_t)h->base_timestamp);
    put_be64_at(p + 35, (uint64_t)h->max_timestamp);
    put_be32_at(p + 57, (uint32_t)h->records_count);
    if (seal)
        put_be32_at(p + 17, crc32c(p + CRC_COVERED_FROM, dst->len - start - CRC_COVERED_FROM));
    return 0;
}

/* A batch that keeps some records: same base offset, last offset delta, producer fields and
 * codec (Kafka's buildRetainedRecordsInto); base timestamp = the delete horizon if one is
 * due, else the first kept record's timestamp. Compressed ones go to `pending`. */
static int rebuild_batch(BatchFilter *bf, const uint8_t *raw, const Batch *b, const BatchTally *t,
                         Failure *f)
{
    NewHeader h = {b->attributes, t->first_timestamp, t->max_timestamp, t->kept};
    if (b->attributes & ATTR_DELETE_HORIZON) {
        h.base_timestamp = b->base_timestamp;
    } else if (t->tombstones_kept) {
        h.attributes |= ATTR_DELETE_HORIZON;
        h.base_timestamp = bf->new_horizon_ms;
    }
    if (b->attributes & ATTR_LOG_APPEND_TIME)
        h.max_timestamp = b->max_timestamp;
    const KeptRecord *kept = (const KeptRecord *)bf->kept.data;
    int codec = b->attributes & ATTR_COMPRESSION_MASK;
    if (!codec)
        return write_batch(&bf->out, raw, &h, kept, t->kept, 1, f);
    int64_t entry[4] = {(int64_t)bf->out.len, (int64_t)bf->pending_batches.len, 0, codec};
    if (write_batch(&bf->pending_batches, raw, &h, kept, t->kept, 0, f))
        return -1;
    entry[2] = (int64_t)bf->pending_batches.len;
    return buf_put(&bf->pending, entry, sizeof entry) ? fail_no_memory(f) : 0;
}

/* The batch's tally from its decisions alone (decide_records validated its records). */
static void tally_decisions(const BatchFilter *bf, const Batch *b, BatchTally *t)
{
    const uint8_t *decisions = bf->decisions.data + bf->decision_at;
    for (int32_t i = 0; i < b->records_count; i++) {
        t->kept += decisions[i] & DECISION_KEEP;
        t->tombstones_kept += decisions[i] == (DECISION_KEEP | DECISION_TOMBSTONE);
    }
    t->total = b->records_count;
}

static int filter_batch(BatchFilter *bf, const uint8_t *raw, const Batch *b, Cursor records,
                        Failure *f)
{
    BatchTally t = {0, 0, 0, 0, 0};
    if (bf->decisions.len - bf->decision_at < (size_t)b->records_count)
        return fail(f, FAIL_USAGE, "more records than decisions at byte %lld",
                    (long long)b->position);
    tally_decisions(bf, b, &t);
    int whole = t.kept == t.total && (t.tombstones_kept == 0 ||
                                      (b->attributes & ATTR_DELETE_HORIZON));
    if (whole || t.kept == 0) {
        bf->decision_at += (size_t)b->records_count; /* no record needs parsing */
    } else {
        t = (BatchTally){0, 0, 0, 0, 0};
        if (filter_records(bf, b, records, &t, f))
            return -1;
    }
    bf->records_read += t.total;
    bf->records_kept += t.kept;
    int has_horizon = (b->attributes & ATTR_DELETE_HORIZON) != 0;
    if (t.total > 0 && t.kept == t.total && (t.tombstones_kept == 0 || has_horizon))
        return buf_put(&bf->out, raw, b->size_bytes) ? fail_no_memory(f) : 0;
    if (t.kept > 0)
        return rebuild_batch(bf, raw, b, &t, f);
    int64_t producer_id = (int64_t)be64(raw + PRODUCER_ID_AT);
    if (producer_id >= 0 && is_protected(bf, batch_next_offset(b) - 1)) {
        /* the producer's last batch stays, empty, so its state survives (an emptied batch
         * that no longer is goes, as Kafka's DELETE_EMPTY) */
        NewHeader h = {(int16_t)(b->attributes & ~ATTR_COMPRESSION_MASK), b->base_timestamp,
                       b->max_timestamp, 0};
        return write_batch(&bf->out, raw, &h, NULL, 0, 1, f);
    }
    return 0;
}

/* Note a transactional data batch of its producer for the marker after. */
static void note_txn_data(BatchFilter *bf, const Batch *b)
{
    if (!(b->attributes & ATTR_TRANSACTIONAL) || b->producer_id < 0)
        return;
    int64_t *bits = marker_bits(&bf->markers, b->producer_id);
    if (bits != NULL)
        *bits |= MARKER_TXN_DATA;
}

/* Whether the control batch can be discarded (no data of its transaction was seen since
 * the producer's previous marker); clears what the producer's marker ends. */
static int marker_is_discardable(BatchFilter *bf, const Batch *b, Cursor records)
{
    if (b->records_count == 0)
        return 1; /* emptied by an earlier cleaning */
    Record r;
    if (read_record(&records, &r) || r.key.len < 4)
        return 0;
    int16_t type = (int16_t)be16(r.key.data + 2);
    int64_t *bits = marker_bits(&bf->markers, b->producer_id);
    if ((type != CONTROL_TYPE_ABORT && type != CONTROL_TYPE_COMMIT) || bits == NULL)
        return 0;
    int seen = (*bits & MARKER_TXN_DATA) != 0;
    *bits &= ~(int64_t)MARKER_TXN_DATA;
    return !seen;
}

/* The control batch with its delete horizon: same records, base timestamp new_horizon_ms,
 * each record's timestamp delta rebased on it (Kafka rebuilds it so). */
static int stamp_marker(BatchFilter *bf, const uint8_t *raw, const Batch *b, Cursor records,
                        Failure *f)
{
    bf->kept.len = 0;
    for (int32_t i = 0; i < b->records_count; i++) {
        const uint8_t *start = records.p;
        Record r;
        if (read_record(&records, &r))
            return fail(f, FAIL_CORRUPT, "control record %d of the batch at byte %lld is "
                        "malformed", (int)i, (long long)b->position);
        KeptRecord k = kept_record(b, &r, start, records.p);
        if (buf_put(&bf->kept, &k, sizeof k))
            return fail_no_memory(f);
    }
    NewHeader h = {(int16_t)(b->attributes | ATTR_DELETE_HORIZON), bf->new_horizon_ms,
                   b->max_timestamp, b->records_count};
    return write_batch(&bf->out, raw, &h, (const KeptRecord *)bf->kept.data, b->records_count,
                       1, f);
}

/* A control batch: copied, stamped with its delete horizon, or removed (see above). */
static int filter_control(BatchFilter *bf, const uint8_t *raw, const Batch *b, const Input *in,
                          Failure *f)
{
    if (bf->markers.capacity == 0 || (b->attributes & ATTR_COMPRESSION_MASK))
        return buf_put(&bf->out, raw, b->size_bytes) ? fail_no_memory(f) : 0;
    Cursor records = {raw + BATCH_HEADER_BYTES, raw + b->size_bytes};
    int discardable = marker_is_discardable(bf, b, records);
    int protected = marker_is_protected(&bf->markers, b->producer_id,
                                        (int16_t)be16(raw + PRODUCER_EPOCH_AT));
    if (!discardable || protected || batch_next_offset(b) >= bf->scope.end_offset)
        return buf_put(&bf->out, raw, b->size_bytes) ? fail_no_memory(f) : 0;
    if (b->attributes & ATTR_DELETE_HORIZON) {
        if (b->base_timestamp <= bf->now_ms)
            return 0; /* past its delete horizon: removed */
        return buf_put(&bf->out, raw, b->size_bytes) ? fail_no_memory(f) : 0;
    }
    if (check_batch_crc(in->buf, b->position, b->size_bytes, b->crc, f))
        return -1;
    return stamp_marker(bf, raw, b, records, f);
}

static int filter_batches(const Input *in, BatchFilter *bf, Failure *f)
{
    Batch b = {0};
    int status = decide_records(in, bf, f);
    size_t pos = 0;
    Py_ssize_t section = 0;
    if (status)
        return status;
    if (buf_reserve(&bf->out, in->len + FILTER_OUT_SLACK_BYTES))
        return fail_no_memory(f);
    while ((status = next_batch(in->buf, in->len, &pos, &b, f)) == 1) {
        const uint8_t *raw = in->buf + b.position;
        if (b.attributes & ATTR_CONTROL) {
            if (filter_control(bf, raw, &b, in, f))
                return -1;
            continue;
        }
        note_txn_data(bf, &b);
        Cursor records;
        if (batch_records(in, &b, pos, &section, &records, f))
            return -1;
        if (filter_batch(bf, raw, &b, records, f))
            return -1;
    }
    if (status == 0 && section != in->section_count)
        return fail(f, FAIL_USAGE, "%lld decompressed sections given, %lld used",
                    (long long)in->section_count, (long long)section);
    return status;
}

/* ---- Python glue of the cleaner passes */

typedef struct {
    Held held;
    Py_buffer fps, words, protected_last_offsets, aborted, marker_slots, protected_markers;
} CleanerArgs;

static void release_cleaner_args(CleanerArgs *a)
{
    Py_buffer *all[] = {&a->fps, &a->words, &a->protected_last_offsets, &a->aborted,
                        &a->marker_slots, &a->protected_markers};
    for (int i = 0; i < 6; i++)
        if (all[i]->obj != NULL)
            PyBuffer_Release(all[i]);
    release_held(&a->held);
}

/* Hold the map's writable tables and fill the scope from them. */
static int hold_map_tables(CleanerArgs *a, PyObject *fps, PyObject *words, PassScope *scope)
{
    int table_flags = PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE;
    if (PyObject_GetBuffer(fps, &a->fps, table_flags) < 0 ||
        PyObject_GetBuffer(words, &a->words, table_flags) < 0)
        return -1;
    Py_ssize_t capacity = a->fps.len / 8;
    if (capacity < 1 || capacity > 0xffffffffLL || a->words.len != capacity * 4) {
        PyErr_SetString(PyExc_ValueError, "offset map: mismatched table sizes");
        return -1;
    }
    if (scope->range_low > scope->range_high || scope->next_ordinal < 0) {
        PyErr_SetString(PyExc_ValueError, "cleaner pass: empty hash range or negative ordinal");
        return -1;
    }
    scope->fps = a->fps.buf;
    scope->words = a->words.buf;
    scope->capacity = (uint64_t)capacity;
    return 0;
}

/* Hold the marker table (writable int64 pairs, a power of two of them, or none) and the
 * protected markers' (producer id, epoch) pairs; point `t` at them. */
static int hold_markers(CleanerArgs *a, PyObject *slots, PyObject *protected_markers,
                        TxnMarkers *t)
{
    if (PyObject_GetBuffer(slots, &a->marker_slots, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0 ||
        PyObject_GetBuffer(protected_markers, &a->protected_markers, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    uint64_t capacity = (uint64_t)a->marker_slots.len / (2 * sizeof(int64_t));
    if (a->marker_slots.len % (2 * (Py_ssize_t)sizeof(int64_t)) != 0 ||
        (capacity & (capacity - 1)) != 0 ||
        a->protected_markers.len % (2 * (Py_ssize_t)sizeof(int64_t)) != 0) {
        PyErr_SetString(PyExc_ValueError, "cleaner pass: the marker table is not a power of "
                        "two of int64 pairs, or the protected markers are not pairs");
        return -1;
    }
    t->slots = a->marker_slots.buf;
    t->capacity = capacity;
    t->protected_markers = a->protected_markers.buf;
    t->protected_count = a->protected_markers.len / (2 * (Py_ssize_t)sizeof(int64_t));
    return 0;
}

/* Hold the aborted transactions' triples (int64, native order) and point the scope at them. */
static int hold_aborted(CleanerArgs *a, PyObject *aborted, PassScope *scope)
{
    if (PyObject_GetBuffer(aborted, &a->aborted, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (a->aborted.len % (3 * (Py_ssize_t)sizeof(int64_t)) != 0) {
        PyErr_SetString(PyExc_ValueError, "cleaner pass: aborted transactions are not triples");
        return -1;
    }
    scope->aborted = a->aborted.buf;
    scope->aborted_count = a->aborted.len / (3 * (Py_ssize_t)sizeof(int64_t));
    return 0;
}

/* Hold the record buffer, its sections and the map's writable tables; fill the scope. */
static int hold_cleaner_args(CleanerArgs *a, PyObject *buf, PyObject *sections, PyObject *fps,
                             PyObject *words, PassScope *scope)
{
    if (hold(buf, sections, &a->held))
        return -1;
    return hold_map_tables(a, fps, words, scope);
}

static PyObject *py_map_batches(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *buf, *sections, *fps, *words, *aborted;
    long long room, first, end, ordinal;
    unsigned long long low, high;
    CleanerArgs held;
    MapBuild build;
    Failure failure = {FAIL_NONE, ""};
    memset(&held, 0, sizeof held);
    memset(&build, 0, sizeof build);
    if (!PyArg_ParseTuple(args, "OOOOLLLKKLO", &buf, &sections, &fps, &words, &room, &first,
                          &end, &low, &high, &ordinal, &aborted))
        return NULL;
    build.scope = (PassScope){NULL, NULL, 0, first, end, low, high, ordinal, NULL, 0};
    build.room = room;
    if (hold_cleaner_args(&held, buf, sections, fps, words, &build.scope) ||
        hold_aborted(&held, aborted, &build.scope)) {
        release_cleaner_args(&held);
        return NULL;
    }
    Input in = input_of(&held.held, 1);
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = walk_records(&in, visit_map_build, &build, &failure);
    if (status == 0)
        status = map_build_drain(&build);
    Py_END_ALLOW_THREADS
    release_cleaner_args(&held);
    if (status < 0)
        return raise_failure(&failure);
    return Py_BuildValue("LLLi", (long long)build.records_read,
                         (long long)build.scope.next_ordinal, (long long)build.added, build.full);
}

static PyObject *py_filter_batches(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *buf, *sections, *fps, *words, *protected_offsets, *aborted, *marker_slots,
        *protected_markers;
    long long first, end, ordinal, now_ms, horizon_ms;
    unsigned long long low, high;
    CleanerArgs held;
    BatchFilter bf;
    Failure failure = {FAIL_NONE, ""};
    memset(&held, 0, sizeof held);
    memset(&bf, 0, sizeof bf);
    if (!PyArg_ParseTuple(args, "OOOOLLKKLLLOOOO", &buf, &sections, &fps, &words, &first,
                          &end, &low, &high, &ordinal, &now_ms, &horizon_ms, &protected_offsets,
                          &aborted, &marker_slots, &protected_markers))
        return NULL;
    bf.scope = (PassScope){NULL, NULL, 0, first, end, low, high, ordinal, NULL, 0};
    bf.now_ms = now_ms;
    bf.new_horizon_ms = horizon_ms;
    if (hold_cleaner_args(&held, buf, sections, fps, words, &bf.scope) ||
        hold_aborted(&held, aborted, &bf.scope) ||
        hold_markers(&held, marker_slots, protected_markers, &bf.markers) ||
        PyObject_GetBuffer(protected_offsets, &held.protected_last_offsets,
                           PyBUF_C_CONTIGUOUS) < 0) {
        release_cleaner_args(&held);
        return NULL;
    }
    bf.protected_last_offsets = held.protected_last_offsets.buf;
    bf.protected_count = held.protected_last_offsets.len / 8;
    Input in = input_of(&held.held, 1);
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = filter_batches(&in, &bf, &failure);
    Py_END_ALLOW_THREADS
    release_cleaner_args(&held);
    free(bf.kept.data);
    free(bf.decisions.data);
    Buf outputs[3] = {bf.out, bf.pending, bf.pending_batches};
    PyObject *buffers = outputs_or_raise(outputs, 3, status, &failure);
    if (buffers == NULL)
        return NULL;
    return Py_BuildValue("NLLL", buffers, (long long)bf.records_read, (long long)bf.records_kept,
                         (long long)bf.scope.next_ordinal);
}

/* ---- the cleaner passes over whole spans of a segment file
 * map_span and filter_span run a pass over about span_bytes of a segment's file in one call,
 * without the GIL and without returning to Python per chunk: they pread chunks of the
 * caller's buffer size at the position, run the pass over each chunk's whole batches (a batch
 * straddling the chunk's end is read again at the start of the next chunk), and filter_span
 * writes each chunk's cleaned bytes to the output file (so memory stays at the read buffer
 * plus one chunk of output) -- for an O_DIRECT output, through the caller's stage, written
 * out in whole stage-sized blocks (the staged rest is returned, for the next call) -- and
 * index it as recovery would. A span ends at the first chunk starting at or after
 * position + span_bytes, or early, at the position reached:
 *   SPAN_COMPRESSED  a compressed batch starts there (its records are decompressed -- and in
 *                    pass 2 recompressed -- in Python);
 *   SPAN_GROW        the batch there is larger than the buffer (stop_bytes: its size);
 *   SPAN_FULL        pass 1 only: the map is full.
 * A batch that runs past the end position (or the end of the file) is CorruptMessage. */

#define SPAN_DONE 0
#define SPAN_COMPRESSED 1
#define SPAN_GROW 2
#define SPAN_FULL 3

typedef struct {
    int fd;
    int direct_fd; /* the same file opened O_DIRECT, or -1: see span_read */
    uint8_t *buf;
    uint8_t *data; /* where the chunk read at `position` starts in buf */
    size_t capacity;
    int64_t position, end_position, span_bytes;
    int stop;
    int64_t stop_bytes;
    int os_errno; /* a failed pread or write: raised as OSError */
    int cooperative; /* pauses while the broker serves requests (a niced span) */
    int64_t cpu_at_pause_ns; /* cooperative: the thread's CPU time at its last pause */
} Span;

/* ---- cooperative spans
 * A niced span (the broker's cleaner) gives the CPU back while the broker is serving requests:
 * the event loop stores the time of each request it receives (the broker's
 * note_broker_request, through the word cooperative_spans.h describes), and a
 * span that has used SPAN_RUN_QUANTUM_NS of CPU since it last paused (time blocked in reads
 * does not count), with a request received in the last BROKER_ACTIVE_WINDOW_NS, sleeps
 * SPAN_PAUSE_NS after its current chunk. Nice values
 * alone do not do this on Linux's EEVDF scheduler: a thread woken on the span's CPU (the
 * event loop on a request, the append thread, a client on the same machine) was measured
 * waiting 2-6 ms, up to a scheduler tick, before the span was preempted. A pause frees the
 * CPU at once, so such a thread waits at most about one quantum plus one chunk. The pause is
 * bounded -- at most one per chunk, after at least a quantum of CPU -- so a broker busy all
 * along never starves its cleaning: each quantum costs one pause plus the wait for a CPU on
 * waking (bench/cleaner.py --busy-broker: about a third slower on a loaded 2-core machine);
 * an idle broker's cleaning never pauses. */

#define SPAN_RUN_QUANTUM_NS 250000LL
#define SPAN_PAUSE_NS 50000LL
#define BROKER_ACTIVE_WINDOW_NS 50000000LL
#define SPAN_TIMER_SLACK_NS 5000UL /* the pause's timer slack (Linux defaults to 50 us) */

static int64_t broker_request_ns; /* CLOCK_MONOTONIC of the latest request; 0 = none yet */

/* After each chunk: a cooperative span pauses as described above; any span yields the CPU to
 * a thread waiting for it on this CPU (which, with EEVDF, rarely is one of a nicer weight). */
static void span_give_way(Span *s)
{
    if (s->cooperative) {
        int64_t cpu_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        int64_t request_ns = __atomic_load_n(&broker_request_ns, __ATOMIC_RELAXED);
        if (cpu_ns - s->cpu_at_pause_ns >= SPAN_RUN_QUANTUM_NS && request_ns != 0 &&
                monotonic_ns() - request_ns < BROKER_ACTIVE_WINDOW_NS) {
            struct timespec pause = {0, SPAN_PAUSE_NS};
            while (nanosleep(&pause, &pause) != 0 && errno == EINTR)
                ;
            s->cpu_at_pause_ns = cpu_ns;
            return;
        }
    }
    sched_yield();
}

/* Runs a pass over one chunk of whole, uncompressed (or control) batches: 0 to go on, 1 when
 * the pass cannot take more (pass 1: map full), -1 on failure. */
typedef int (*ChunkPass)(void *state, const uint8_t *buf, size_t len, Failure *f);

static int span_os_failure(Span *s, Failure *f, const char *call)
{
    s->os_errno = errno;
    return fail(f, FAIL_USAGE, "%s failed", call);
}

/* ---- reading a span's chunks
 * A chunk in the page cache is read with pread (a copy). A chunk not (wholly) in the page
 * cache is read with O_DIRECT through `direct_fd` when the span has one: a buffered read of
 * uncached data allocates page cache and runs readahead, which on a small machine was measured
 * to stall the broker's other threads (a paced producer's p99 went from 0.4 ms to 14 ms while
 * dd read an uncached file, and stayed at 0.5 ms with iflag=direct), and it would evict the
 * pages the broker's readers use for bytes the cleaner reads once. Whether a range is cached is
 * asked with cachestat(2) (Linux 6.5), or with mincore(2) over a mapping of the chunk on
 * older kernels; a chunk the kernel cannot tell about is read buffered.
 * An O_DIRECT read must start, end and land on a multiple of DIRECT_READ_ALIGN_BYTES: the
 * buffer is aligned, the file offset of buf[0] is the chunk's position rounded down, so the
 * chunk starts at buf + position % align and a chunk of `want` bytes needs
 * want + DIRECT_READ_SLACK_BYTES of buffer. */

#define DIRECT_READ_ALIGN_BYTES 4096
#define DIRECT_READ_SLACK_BYTES (2 * DIRECT_READ_ALIGN_BYTES)
#ifndef __NR_cachestat
#define __NR_cachestat 451 /* the same number on every architecture */
#endif

struct cachestat_range_arg {
    uint64_t off, len;
};

struct cachestat_result {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

static int cachestat_usable = 1; /* cleared on ENOSYS (before Linux 6.5): mincore then */

/* Environment variable that picks the page-cache probe at import: "mincore" (what kernels
 * before 6.5 get) or unset/"cachestat" (cachestat(2) while the kernel has it). For testing the
 * mincore path on any kernel, in a process of its own. */
#define PAGE_CACHE_PROBE_ENV "HEADRACE_PAGE_CACHE_PROBE"

static void page_cache_probe_init(void)
{
    const char *probe = getenv(PAGE_CACHE_PROBE_ENV);
    if (probe != NULL && strcmp(probe, "mincore") == 0)
        cachestat_usable = 0;
}

/* Whether every page of [first, end) (first page-aligned) of fd is cached, by mincore(2)
 * over a shared read-only mapping of the range (which faults nothing in): -1 if the kernel
 * cannot tell. */
static int range_cached_by_mincore(int fd, int64_t first, int64_t end, long page_bytes)
{
    size_t map_bytes = (size_t)(end - first);
    size_t pages = (map_bytes + (size_t)page_bytes - 1) / (size_t)page_bytes;
    unsigned char *resident = malloc(pages);
    if (resident == NULL)
        return -1;
    int cached = -1;
    void *map = mmap(NULL, map_bytes, PROT_READ, MAP_SHARED, fd, (off_t)first);
    if (map != MAP_FAILED) {
        if (mincore(map, map_bytes, resident) == 0) {
            cached = 1;
            for (size_t i = 0; i < pages && cached; i++)
                cached = resident[i] & 1;
        }
        munmap(map, map_bytes);
    }
    free(resident);
    return cached;
}

/* 1 if every page of [position, position + len) of fd is in the page cache (or the kernel
 * cannot tell), else 0: cachestat(2), or mincore(2) where cachestat is missing. */
static int range_cached(int fd, int64_t position, size_t len)
{
    long page_bytes = sysconf(_SC_PAGESIZE);
    int64_t first = position / page_bytes * page_bytes;
    int64_t end = position + (int64_t)len;
    if (end <= first)
        return 1;
    if (__atomic_load_n(&cachestat_usable, __ATOMIC_RELAXED)) {
        struct cachestat_range_arg range = {(uint64_t)first, (uint64_t)(end - first)};
        struct cachestat_result stat;
        if (syscall(__NR_cachestat, fd, &range, &stat, 0) == 0)
            return stat.nr_cache >= (uint64_t)((end - first + page_bytes - 1) / page_bytes);
        if (errno != ENOSYS)
            return 1;
        __atomic_store_n(&cachestat_usable, 0, __ATOMIC_RELAXED);
    }
    return range_cached_by_mincore(fd, first, end, page_bytes) != 0;
}

static PyObject *py_page_cache_holds(PyObject *self, PyObject *args)
{
    (void)self;
    int fd;
    long long position, length;
    if (!PyArg_ParseTuple(args, "iLL", &fd, &position, &length))
        return NULL;
    if (position < 0 || length < 0) {
        PyErr_SetString(PyExc_ValueError, "page_cache_holds: negative position or length");
        return NULL;
    }
    return PyBool_FromLong(range_cached(fd, position, (size_t)length));
}

static PyObject *py_page_cache_probe(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_FromString(__atomic_load_n(&cachestat_usable, __ATOMIC_RELAXED)
                                ? "cachestat" : "mincore");
}

static PyObject *py_use_cachestat(PyObject *self, PyObject *flag)
{
    (void)self;
    int use = PyObject_IsTrue(flag);
    if (use < 0)
        return NULL;
    int was = __atomic_exchange_n(&cachestat_usable, use, __ATOMIC_RELAXED);
    return PyBool_FromLong(was);
}

/* The bytes a span's buffer needs for a chunk of `chunk_bytes` (its largest batch). */
static int64_t span_buffer_bytes(const Span *s, int64_t chunk_bytes)
{
    return s->direct_fd >= 0 ? chunk_bytes + DIRECT_READ_SLACK_BYTES : chunk_bytes;
}

/* Whether a span with a direct_fd was given a buffer O_DIRECT reads cannot use: unaligned,
 * or no longer than the slack. */
static int direct_buffer_refused(const Span *s)
{
    return s->direct_fd >= 0 && ((uintptr_t)s->buf % DIRECT_READ_ALIGN_BYTES ||
                                 s->capacity <= DIRECT_READ_SLACK_BYTES);
}

/* The largest chunk the span's buffer takes. */
static size_t span_chunk_capacity(const Span *s)
{
    return s->direct_fd >= 0 ? s->capacity - DIRECT_READ_SLACK_BYTES : s->capacity;
}

/* pread in full into `to`: fewer bytes only at end of file (or, O_DIRECT, an unaligned
 * count: the file ends there). */
static int read_fully(Span *s, int fd, uint8_t *to, size_t want, int64_t position,
                      size_t *got, Failure *f)
{
    size_t done = 0;
    while (done < want) {
        ssize_t n = pread(fd, to + done, want - done, (off_t)(position + (int64_t)done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return span_os_failure(s, f, "pread");
        if (n == 0)
            break;
        done += (size_t)n;
        if (fd == s->direct_fd && done % DIRECT_READ_ALIGN_BYTES)
            break;
    }
    *got = done;
    return 0;
}

/* Read up to `want` bytes at the span's position (s->data); fewer only at end of file. */
static int span_read(Span *s, size_t want, size_t *got, Failure *f)
{
    if (s->direct_fd < 0) {
        s->data = s->buf;
        return read_fully(s, s->fd, s->buf, want, s->position, got, f);
    }
    int64_t start = s->position / DIRECT_READ_ALIGN_BYTES * DIRECT_READ_ALIGN_BYTES;
    s->data = s->buf + (s->position - start);
    if (range_cached(s->fd, s->position, want))
        return read_fully(s, s->fd, s->data, want, s->position, got, f);
    int64_t end = s->position + (int64_t)want;
    int64_t aligned_end = (end + DIRECT_READ_ALIGN_BYTES - 1) / DIRECT_READ_ALIGN_BYTES *
                          DIRECT_READ_ALIGN_BYTES;
    size_t direct_got = 0;
    if (read_fully(s, s->direct_fd, s->buf, (size_t)(aligned_end - start), start, &direct_got,
                   f))
        return -1;
    int64_t past = start + (int64_t)direct_got - s->position;
    *got = past <= 0 ? 0 : past < (int64_t)want ? (size_t)past : want;
    return 0;
}

/* Bytes of the whole batches at the start of buf before the first compressed non-control
 * batch (control batches are copied or skipped whole by both passes), each CRC-checked;
 * *compressed_next tells whether a whole compressed batch follows them. */
static int plain_prefix(const uint8_t *buf, size_t len, size_t *prefix, int *compressed_next,
                        Failure *f)
{
    Batch b = {0};
    size_t pos = 0;
    int status;
    *prefix = 0;
    *compressed_next = 0;
    while ((status = next_batch(buf, len, &pos, &b, f)) == 1) {
        if ((b.attributes & ATTR_COMPRESSION_MASK) && !(b.attributes & ATTR_CONTROL)) {
            *compressed_next = 1;
            return 0;
        }
        if (check_batch_crc(buf, b.position, b.size_bytes, b.crc, f))
            return -1;
        *prefix = pos;
    }
    return status;
}

/* Name the file position of the chunk in a chunk-relative failure message. */
static int chunk_failure(const Span *s, Failure *f)
{
    if (f->kind == FAIL_CORRUPT) {
        char message[FAILURE_MESSAGE_BYTES];
        snprintf(message, sizeof message, "%s", f->message);
        fail(f, FAIL_CORRUPT, "in the chunk read at file position %lld: %s",
             (long long)s->position, message);
    }
    return -1;
}

/* Why no whole batch starts at the position: too large for the buffer (SPAN_GROW), or it
 * runs past the end (corrupt). */
static int span_no_whole_batch(Span *s, size_t want, size_t got, Failure *f)
{
    int64_t remaining = s->end_position - s->position;
    if (got >= LOG_OVERHEAD_BYTES) {
        int64_t batch_bytes = (int64_t)(int32_t)be32(s->data + 8) + LOG_OVERHEAD_BYTES;
        if (got == want && batch_bytes <= remaining) {
            s->stop = SPAN_GROW;
            s->stop_bytes = span_buffer_bytes(s, batch_bytes);
            return 0;
        }
    }
    return fail(f, FAIL_CORRUPT, "record batch at file position %lld runs past the end (%lld "
                "bytes left)", (long long)s->position,
                (long long)(got < want ? (int64_t)got : remaining));
}

static int run_span(Span *s, ChunkPass pass, void *state, Failure *f)
{
    int64_t span_end = s->position + s->span_bytes;
    s->stop = SPAN_DONE;
    while (s->position < s->end_position && s->position < span_end) {
        int64_t remaining = s->end_position - s->position;
        size_t chunk_capacity = span_chunk_capacity(s);
        size_t want = remaining < (int64_t)chunk_capacity ? (size_t)remaining : chunk_capacity;
        size_t got = 0, prefix = 0;
        int compressed_next = 0;
        if (span_read(s, want, &got, f))
            return -1;
        if (plain_prefix(s->data, got, &prefix, &compressed_next, f))
            return chunk_failure(s, f);
        if (prefix == 0 && compressed_next) {
            s->stop = SPAN_COMPRESSED;
            return 0;
        }
        if (prefix == 0)
            return span_no_whole_batch(s, want, got, f);
        int status = pass(state, s->data, prefix, f);
        if (status < 0)
            return chunk_failure(s, f);
        s->position += (int64_t)prefix;
        if (status == 1) {
            s->stop = SPAN_FULL;
            return 0;
        }
        /* Give the CPU to any thread waiting for it (the event loop, a client) after each
         * chunk: a CPU-bound span is otherwise left running for a whole scheduler tick
         * (several ms) while a woken thread waits on its CPU, nice value or not. */
        span_give_way(s);
    }
    return 0;
}

/* A span run on a helper thread `niceness` nicer than the caller. The caller is a Python
 * thread: it waits without the GIL and re-takes the GIL at its own, normal priority, so the
 * GIL is never held by a thread the scheduler puts behind other work (which would stall every
 * other Python thread of the process), while the span's CPU work yields to the rest. */
typedef struct {
    Span *span;
    ChunkPass pass;
    void *state;
    Failure *failure;
    int niceness, status;
} NicedSpan;

static void *niced_span_main(void *arg)
{
    NicedSpan *n = arg;
    errno = 0;
    int current = getpriority(PRIO_PROCESS, 0); /* Linux: 0 is the calling thread */
    if (errno == 0 && setpriority(PRIO_PROCESS, 0, current + n->niceness) < 0)
        errno = 0; /* a sandbox may refuse: the span then runs at the caller's priority */
    prctl(PR_SET_TIMERSLACK, SPAN_TIMER_SLACK_NS, 0, 0, 0);
    prctl(PR_SET_NAME, "hr-clean-span", 0, 0, 0);
    n->span->cooperative = 1;
    n->span->cpu_at_pause_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    n->status = run_span(n->span, n->pass, n->state, n->failure);
    return NULL;
}

/* run_span, on a helper thread `niceness` (> 0) nicer than the caller and cooperative; in
 * the caller when niceness is 0 or no thread can be started. Call without the GIL. */
static int run_span_niced(Span *s, ChunkPass pass, void *state, Failure *f, int niceness)
{
    NicedSpan n = {s, pass, state, f, niceness, -1};
    pthread_t thread;
    if (niceness <= 0 || pthread_create(&thread, NULL, niced_span_main, &n) != 0)
        return run_span(s, pass, state, f);
    pthread_join(thread, NULL);
    return n.status;
}

static int map_chunk(void *state, const uint8_t *buf, size_t len, Failure *f)
{
    MapBuild *m = state;
    Input in = {buf, len, NULL, 0, 1};
    int status = walk_records(&in, visit_map_build, m, f);
    return status == 0 ? map_build_drain(m) : status;
}

typedef struct {
    BatchFilter bf;
    Span *span; /* for a failed write's errno */
    int out_fd;
    int64_t bytes_written;
    IndexInput index_in; /* the output's index: interval, position of the span's output */
    IndexScan index;     /* entries for the output written so far, as recovery computes them */
    uint8_t *stage;      /* NULL, or output staged into whole blocks of stage_capacity bytes */
    size_t stage_capacity, stage_fill;
} SpanFilter;

/* Write to the output file (no GIL here: an interrupted write is simply retried). */
static int write_out(SpanFilter *sf, const uint8_t *data, size_t len, Failure *f)
{
    size_t written = 0;
    int error;
    while ((error = write_fully(sf->out_fd, data, len, &written)) == EINTR)
        ;
    if (error == 0)
        return 0;
    errno = error;
    return span_os_failure(sf->span, f, "write");
}

/* Write the chunk's output: straight to the file, or (for an O_DIRECT file, whose writes
 * must be whole aligned blocks) through the stage, writing it out each time it is full; the
 * rest stays staged for the next call or the file's close. */
static int write_all(SpanFilter *sf, const uint8_t *data, size_t len, Failure *f)
{
    if (sf->stage == NULL) {
        if (write_out(sf, data, len, f))
            return -1;
        sf->bytes_written += (int64_t)len;
        return 0;
    }
    sf->bytes_written += (int64_t)len;
    while (len > 0) {
        size_t room = sf->stage_capacity - sf->stage_fill;
        size_t n = len < room ? len : room;
        memcpy(sf->stage + sf->stage_fill, data, n);
        sf->stage_fill += n;
        data += n;
        len -= n;
        if (sf->stage_fill == sf->stage_capacity) {
            if (write_out(sf, sf->stage, sf->stage_capacity, f))
                return -1;
            sf->stage_fill = 0;
        }
    }
    return 0;
}

/* Index the chunk's output at the file position it is written to, exactly as recovery would
 * index the finished file (which also CRC-checks every output batch), so the swap needs no
 * re-read of the cleaned file. */
static int index_output(SpanFilter *sf, Failure *f)
{
    IndexInput in = sf->index_in;
    in.buf = sf->bf.out.data;
    in.len = sf->bf.out.len;
    in.buffer_position += sf->bytes_written;
    sf->index.positions.len = 0;
    if (index_batches(&in, &sf->index, f))
        return -1;
    if (sf->index.consumed != in.len)
        return fail(f, FAIL_CORRUPT, "cleaned output at file position %lld fails validation",
                    (long long)(in.buffer_position + (int64_t)sf->index.consumed));
    return 0;
}

static int filter_chunk(void *state, const uint8_t *buf, size_t len, Failure *f)
{
    SpanFilter *sf = state;
    Input in = {buf, len, NULL, 0, 1};
    sf->bf.decisions.len = 0;
    sf->bf.out.len = 0;
    if (filter_batches(&in, &sf->bf, f))
        return -1;
    if (sf->bf.pending.len)
        return fail(f, FAIL_USAGE, "a compressed batch reached filter_span's chunk pass");
    if (index_output(sf, f))
        return -1;
    return write_all(sf, sf->bf.out.data, sf->bf.out.len, f);
}

/* Hold the read buffer (writable) and the map tables; fill the span and the scope. */
static int hold_span_args(CleanerArgs *a, PyObject *buffer, Span *span, PassScope *scope,
                          PyObject *fps, PyObject *words)
{
    if (PyObject_GetBuffer(buffer, &a->held.input, PyBUF_WRITABLE) < 0 ||
        hold_map_tables(a, fps, words, scope))
        return -1;
    span->buf = a->held.input.buf;
    span->capacity = (size_t)a->held.input.len;
    if (span->capacity == 0 || span->position < 0 || span->span_bytes < 1) {
        PyErr_SetString(PyExc_ValueError, "span: empty buffer, negative position or span");
        return -1;
    }
    if (direct_buffer_refused(span)) {
        PyErr_Format(PyExc_ValueError, "span: a direct_fd needs a buffer aligned to %d bytes "
                     "and longer than %d", DIRECT_READ_ALIGN_BYTES, DIRECT_READ_SLACK_BYTES);
        return -1;
    }
    return 0;
}

/* The span's outcome, or its failure as OSError / CorruptMessage. */
static PyObject *span_failed(const Span *s, const Failure *f)
{
    if (s->os_errno) {
        errno = s->os_errno;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return raise_failure(f);
}

static PyObject *py_read_chunk(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *buffer;
    long long want;
    Span span;
    Py_buffer view = {0};
    Failure failure = {FAIL_NONE, ""};
    memset(&span, 0, sizeof span);
    if (!PyArg_ParseTuple(args, "iiOLL", &span.fd, &span.direct_fd, &buffer, &span.position,
                          &want))
        return NULL;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE) < 0)
        return NULL;
    span.buf = view.buf;
    span.capacity = (size_t)view.len;
    if (direct_buffer_refused(&span) || want < 0 || span.position < 0 ||
            (size_t)want > span_chunk_capacity(&span)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "read_chunk: negative position or size, a chunk "
                        "larger than the buffer takes, or a direct_fd with an unaligned buffer");
        return NULL;
    }
    size_t got = 0;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = span_read(&span, (size_t)want, &got, &failure);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (status < 0)
        return span_failed(&span, &failure);
    return Py_BuildValue("nn", (Py_ssize_t)(span.data - span.buf), (Py_ssize_t)got);
}

static PyObject *py_map_span(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *buffer, *fps, *words, *aborted;
    long long room, first, end, ordinal;
    unsigned long long low, high;
    CleanerArgs held;
    MapBuild build;
    Span span;
    Failure failure = {FAIL_NONE, ""};
    memset(&held, 0, sizeof held);
    memset(&build, 0, sizeof build);
    memset(&span, 0, sizeof span);
    int niceness;
    if (!PyArg_ParseTuple(args, "iOLLLOOLLLKKLiiO", &span.fd, &buffer, &span.position,
                          &span.end_position, &span.span_bytes, &fps, &words, &room, &first,
                          &end, &low, &high, &ordinal, &niceness, &span.direct_fd, &aborted))
        return NULL;
    build.scope = (PassScope){NULL, NULL, 0, first, end, low, high, ordinal, NULL, 0};
    build.room = room;
    if (hold_span_args(&held, buffer, &span, &build.scope, fps, words) ||
        hold_aborted(&held, aborted, &build.scope)) {
        release_cleaner_args(&held);
        return NULL;
    }
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = run_span_niced(&span, map_chunk, &build, &failure, niceness);
    Py_END_ALLOW_THREADS
    release_cleaner_args(&held);
    if (status < 0)
        return span_failed(&span, &failure);
    return Py_BuildValue("LiLLLL", (long long)span.position, span.stop,
                         (long long)span.stop_bytes, (long long)build.records_read,
                         (long long)build.scope.next_ordinal, (long long)build.added);
}

static PyObject *py_filter_span(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *buffer, *fps, *words, *protected_offsets, *stage, *aborted, *marker_slots,
        *protected_markers;
    long long first, end, ordinal, now_ms, horizon_ms;
    unsigned long long low, high;
    Py_ssize_t stage_fill;
    Py_buffer stage_view = {0};
    CleanerArgs held;
    SpanFilter sf;
    Span span;
    Failure failure = {FAIL_NONE, ""};
    memset(&held, 0, sizeof held);
    memset(&sf, 0, sizeof sf);
    memset(&span, 0, sizeof span);
    IndexState *st = &sf.index.state;
    int niceness;
    if (!PyArg_ParseTuple(args, "iiOLLLOOLLKKLLLOLLL(LLLLp)OniiOOO", &span.fd, &sf.out_fd,
                          &buffer, &span.position, &span.end_position, &span.span_bytes, &fps,
                          &words, &first, &end, &low, &high, &ordinal, &now_ms, &horizon_ms,
                          &protected_offsets, &sf.index_in.buffer_position,
                          &sf.index.next_offset, &sf.index_in.interval_bytes,
                          &st->bytes_since_last_entry, &st->max_timestamp,
                          &st->offset_of_max_timestamp, &st->last_time_entry,
                          &st->has_time_entry, &stage, &stage_fill, &niceness,
                          &span.direct_fd, &aborted, &marker_slots, &protected_markers))
        return NULL;
    if (stage != Py_None) {
        if (PyObject_GetBuffer(stage, &stage_view, PyBUF_WRITABLE) < 0)
            return NULL;
        if (stage_view.len == 0 || stage_fill < 0 || stage_fill >= stage_view.len) {
            PyBuffer_Release(&stage_view);
            PyErr_SetString(PyExc_ValueError, "filter_span: empty stage or fill out of range");
            return NULL;
        }
        sf.stage = stage_view.buf;
        sf.stage_capacity = (size_t)stage_view.len;
        sf.stage_fill = (size_t)stage_fill;
    }
    sf.index_in.file_size = INT64_MAX;
    sf.span = &span;
    sf.bf.scope = (PassScope){NULL, NULL, 0, first, end, low, high, ordinal, NULL, 0};
    sf.bf.now_ms = now_ms;
    sf.bf.new_horizon_ms = horizon_ms;
    if (hold_span_args(&held, buffer, &span, &sf.bf.scope, fps, words) ||
        hold_aborted(&held, aborted, &sf.bf.scope) ||
        hold_markers(&held, marker_slots, protected_markers, &sf.bf.markers) ||
        PyObject_GetBuffer(protected_offsets, &held.protected_last_offsets,
                           PyBUF_C_CONTIGUOUS) < 0) {
        release_cleaner_args(&held);
        if (stage_view.obj != NULL)
            PyBuffer_Release(&stage_view);
        return NULL;
    }
    sf.bf.protected_last_offsets = held.protected_last_offsets.buf;
    sf.bf.protected_count = held.protected_last_offsets.len / 8;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = run_span_niced(&span, filter_chunk, &sf, &failure, niceness);
    Py_END_ALLOW_THREADS
    release_cleaner_args(&held);
    if (stage_view.obj != NULL)
        PyBuffer_Release(&stage_view);
    Buf scratch[6] = {sf.bf.out, sf.bf.pending, sf.bf.pending_batches, sf.bf.kept,
                      sf.bf.decisions, sf.index.positions};
    free_bufs(scratch, 6);
    if (status < 0) {
        Buf entries[2] = {sf.index.offset_entries, sf.index.time_entries};
        free_bufs(entries, 2);
        return span_failed(&span, &failure);
    }
    Buf entries[2] = {sf.index.offset_entries, sf.index.time_entries};
    PyObject *buffers = outputs_or_raise(entries, 2, 0, &failure);
    if (buffers == NULL)
        return NULL;
    return Py_BuildValue("LiLLLLLn(LOL(LLLLi)N)", (long long)span.position, span.stop,
                         (long long)span.stop_bytes, (long long)sf.bf.records_read,
                         (long long)sf.bf.records_kept, (long long)sf.bf.scope.next_ordinal,
                         (long long)sf.bytes_written, (Py_ssize_t)sf.stage_fill,
                         (long long)sf.index.next_offset,
                         sf.index.has_first ? Py_True : Py_False,
                         (long long)sf.index.first_max_timestamp,
                         (long long)st->bytes_since_last_entry, (long long)st->max_timestamp,
                         (long long)st->offset_of_max_timestamp,
                         (long long)st->last_time_entry, st->has_time_entry, buffers);
}

static PyMethodDef segment_io_methods[] = {
    {"append_plain_batch", (PyCFunction)(void (*)(void))py_append_plain_batch, METH_FASTCALL,
     "append_plain_batch(buf, fd, base_offset, leader_epoch, max_size_bytes, max_last_offset, now_ms, "
     "(max_message_bytes, before_max_ms, after_max_ms, required_codec, compacted, "
     "from_client)) -> (last_offset, max_timestamp, written) after validating (and, without "
     "a producer id, compressed records or a max timestamp to rewrite, offsetting and "
     "writing) one batch, or None (declined, nothing written)."},
    {"write_batch", (PyCFunction)(void (*)(void))py_write_batch, METH_FASTCALL,
     "write_batch(buf, fd, base_offset, leader_epoch): rewrite the base offset, stamp the "
     "leader epoch and write the batch to fd."},
    {"index_batches", py_index_batches, METH_VARARGS,
     "index_batches(buf, buffer_position, file_size, min_base_offset, next_offset, "
     "interval_bytes, (bytes_since_last_entry, max_timestamp, offset_of_max_timestamp, "
     "last_time_entry, has_time_entry)) -> (bytes_valid, next_offset, stopped, has_first, "
     "first_max_timestamp, state, (offset_entries, time_entries, positions)): segment "
     "recovery's CRC scan and index rebuild over one chunk."},
    {"offset_map_put", py_offset_map_put, METH_VARARGS,
     "offset_map_put(fingerprints, words, h1, h2, offsets, base_offset, room) -> (inserted, "
     "new_keys, full): insert keys in order until `room` new keys were added or a slot is "
     "out of reach; offsets must lie in [base, base + 2**26)."},
    {"offset_map_get", py_offset_map_get, METH_VARARGS,
     "offset_map_get(fingerprints, words, h1, h2, offsets, base_offset, 0) -> int64 bytes: "
     "the mapped offset of each key or -1 (offsets unused)."},
    {"map_batches", py_map_batches, METH_VARARGS,
     "map_batches(buf, sections, fingerprints, words, room, first_offset, end_offset, "
     "range_low, range_high, first_ordinal) -> (records_read, next_ordinal, new_keys, full): "
     "the cleaner's pass 1 -- map each dirty in-range key to its latest ordinal."},
    {"filter_batches", py_filter_batches, METH_VARARGS,
     "filter_batches(buf, sections, fingerprints, words, first_offset, end_offset, range_low, "
     "range_high, first_ordinal, now_ms, new_horizon_ms, protected_last_offsets, aborted, "
     "marker_slots, protected_markers) -> ((out, "
     "pending, pending_batches), records_read, records_kept, next_ordinal): the cleaner's "
     "pass 2; pending holds int64 (out position, start, end, codec) of compressed batches to "
     "recompress and seal."},
    {"map_span", py_map_span, METH_VARARGS,
     "map_span(fd, buffer, position, end_position, span_bytes, fingerprints, words, room, "
     "first_offset, end_offset, range_low, range_high, first_ordinal, niceness, direct_fd) "
     "-> (position, stop, stop_bytes, records_read, next_ordinal, new_keys): pass 1 over "
     "about span_bytes of a segment file, read in chunks of the buffer's size (less 8 KiB "
     "with a direct_fd, the file opened O_DIRECT for its uncached chunks; -1 for none); "
     "stop is 0 done, 1 compressed batch at position, 2 batch needing a buffer of "
     "stop_bytes, 3 map full."},
    {"filter_span", py_filter_span, METH_VARARGS,
     "filter_span(fd, out_fd, buffer, position, end_position, span_bytes, fingerprints, "
     "words, first_offset, end_offset, range_low, range_high, first_ordinal, now_ms, "
     "new_horizon_ms, protected_last_offsets, out_position, next_offset, interval_bytes, "
     "index_state, stage, stage_fill, niceness, direct_fd, aborted, marker_slots, "
     "protected_markers) -> (position, stop, stop_bytes, "
     "records_read, records_kept, next_ordinal, bytes_written, ...): pass 2 over about "
     "span_bytes of a segment file read as map_span reads it, the cleaned bytes written to "
     "out_fd; stop as for map_span (never 3)."},
    {"page_cache_holds", py_page_cache_holds, METH_VARARGS,
     "page_cache_holds(fd, position, length) -> bool: whether every page of the range is in "
     "the page cache (True where the kernel cannot tell), as the cleaner's spans ask it."},
    {"page_cache_probe", py_page_cache_probe, METH_NOARGS,
     "page_cache_probe() -> str: \"cachestat\" or \"mincore\", the probe the spans use now."},
    {"use_cachestat", py_use_cachestat, METH_O,
     "use_cachestat(flag) -> bool: whether the spans ask the page cache with cachestat(2) "
     "(else mincore(2), as on kernels before 6.5, where cachestat is dropped on its first "
     "ENOSYS); returns the previous setting. For tests of the mincore path."},
    {"read_chunk", py_read_chunk, METH_VARARGS,
     "read_chunk(fd, direct_fd, buffer, position, want) -> (start, got): read up to want "
     "bytes at position as a span reads a chunk (from direct_fd, O_DIRECT, when not all in "
     "the page cache; -1 for none); they are buffer[start:start + got], fewer only at end "
     "of file."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef segment_io_module = {
    PyModuleDef_HEAD_INIT, "headrace.storage._segment_io",
    "Compiled segment I/O and cleaner loops; use headrace.storage.segment_io.", -1,
    segment_io_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__segment_io(void)
{
    crc32c_init();
    page_cache_probe_init();
    if (kernel_common_init() < 0)
        return NULL;
    PyObject *module = PyModule_Create(&segment_io_module);
    if (module == NULL)
        return NULL;
    PyObject *request_word = PyCapsule_New(&broker_request_ns, BROKER_REQUEST_CAPSULE, NULL);
    int added = request_word != NULL &&
                PyModule_AddObjectRef(module, "broker_request_ns", request_word) == 0 &&
                crc32c_add_variant_constants(module) == 0;
    Py_XDECREF(request_word);
    if (!added) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
