/*
 * headrace.protocol._kernel -- the compiled record kernel: the protocol layer's C.
 *
 * Owns the Python functions over Kafka v2 record batches that do no I/O: the header-only scan,
 * decoding records into Arrow-layout columns (decode_columns, and decode_arrow into the
 * caller's buffers), key hashes (MurmurHash3 x64 128), the produce-time record walk
 * (walk_records), and produce validation as Kafka's LogValidator does it (validate_batches,
 * check_compressed_records, first_batch_outside_limits; check_lz4_records: an lz4 batch's
 * section inflated with liblz4's frame decoder, the one library linked, and checked in the
 * same pass), and CRC-32C. The loops themselves are in record_batches.h (batches, records,
 * validation), crc32c.h and kernel_common.h, which the storage layer's C includes too. The
 * Python face is headrace/protocol/kernel.py: it decompresses compressed record sections (one
 * call per batch) and hands them here as `sections`, in the order the walk meets the
 * compressed batches it does not skip.
 *
 * Thread-safety: no shared mutable state after module init (the CRC tables are written
 * and the CRC-32C variant chosen there, from the CPU's features; each thread's lz4 decoder is
 * its own, behind a thread-specific key). Every loop runs with the GIL
 * released over a buffer the caller holds (validate_batches only for 256 KiB or more);
 * output is collected in malloc'd buffers handed to Python as read-only OwnedBuffers
 * (decode_arrow alone writes into writable buffers the caller holds for the call).
 * Malformed input is reported as headrace.errors.CorruptMessage (produce validation: Kafka's
 * InvalidRecord where Kafka's LogValidator answers INVALID_RECORD, and RecordsRejected for
 * per-record errors), never read past.
 */
#define KERNEL_MODULE_NAME "headrace.protocol._kernel"
#include "record_batches.h"

#include <lz4frame.h>
#include <pthread.h>

static PyObject *records_rejected_error; /* _kernel.RecordsRejected: per-record errors */
#define VALIDATE_GIL_RELEASE_MIN_BYTES (256 * 1024)

/* ------------------------------------------------------------------ visitor: columns */

typedef struct {
    Buf offsets, timestamps, timestamp_types;
    Buf key_offsets, key_data, key_valid;
    Buf value_offsets, value_data, value_valid;
    Buf header_list_offsets, header_key_offsets, header_key_data;
    Buf header_value_offsets, header_value_data, header_value_valid;
} Columns;

#define COLUMN_COUNT 15

static Buf *column(Columns *c, int i) { return &((Buf *)c)[i]; }

/* Append one Arrow binary value: data bytes, end offset (int32), validity. */
static int append_binary(Buf *offsets, Buf *data, Buf *valid, Bytes v, Failure *f)
{
    if (v.len > 0 && buf_put(data, v.data, (size_t)v.len))
        return fail_no_memory(f);
    if (data->len > INT32_MAX)
        return fail(f, FAIL_TOO_LARGE,
                    "more than %d bytes in one column: decode fewer batches at a time",
                    INT32_MAX);
    if (put_i32(offsets, (int32_t)data->len) || (valid && put_u8(valid, v.len >= 0)))
        return fail_no_memory(f);
    return 0;
}

static int append_headers(Columns *c, const Record *r, Failure *f)
{
    Cursor headers = r->headers;
    for (int32_t i = 0; i < r->header_count; i++) {
        Bytes key, value;
        if (read_bytes(&headers, &key, 0) || read_bytes(&headers, &value, 1))
            return fail(f, FAIL_CORRUPT, "record header %d is malformed", (int)i);
        if (append_binary(&c->header_key_offsets, &c->header_key_data, NULL, key, f) ||
            append_binary(&c->header_value_offsets, &c->header_value_data,
                          &c->header_value_valid, value, f))
            return -1;
    }
    size_t header_total = c->header_key_offsets.len / sizeof(int32_t) - 1;
    if (header_total > INT32_MAX)
        return fail(f, FAIL_TOO_LARGE, "more than %d headers", INT32_MAX);
    if (put_i32(&c->header_list_offsets, (int32_t)header_total))
        return fail_no_memory(f);
    return 0;
}

static int visit_columns(void *state, const Batch *b, const Record *r, Failure *f)
{
    Columns *c = state;
    int log_append_time = (b->attributes & ATTR_LOG_APPEND_TIME) != 0;
    int64_t timestamp = log_append_time
                            ? b->max_timestamp
                            : (int64_t)((uint64_t)b->base_timestamp + (uint64_t)r->timestamp_delta);
    if (put_i64(&c->offsets, record_offset(b, r)) || put_i64(&c->timestamps, timestamp) ||
        put_u8(&c->timestamp_types, (uint8_t)log_append_time))
        return fail_no_memory(f);
    if (append_binary(&c->key_offsets, &c->key_data, &c->key_valid, r->key, f) ||
        append_binary(&c->value_offsets, &c->value_data, &c->value_valid, r->value, f))
        return -1;
    return append_headers(c, r, f);
}

/* ------------------------------------------------------------------ visitors: keys */

typedef struct {
    Buf offsets, hash_hi, hash_lo, is_tombstone, has_key;
} KeyHashes;

static int visit_key_hash(void *state, const Batch *b, const Record *r, Failure *f)
{
    KeyHashes *k = state;
    uint64_t hash[2] = {0, 0};
    if (r->key.len >= 0)
        murmur3_x64_128(r->key.data, (size_t)r->key.len, 0, hash);
    if (put_i64(&k->offsets, record_offset(b, r)) || put_u64(&k->hash_hi, hash[0]) ||
        put_u64(&k->hash_lo, hash[1]) || put_u8(&k->is_tombstone, r->value.len < 0) ||
        put_u8(&k->has_key, r->key.len >= 0))
        return fail_no_memory(f);
    return 0;
}

static PyObject *py_scan(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *buf;
    int skip_control, verify_crc;
    Held held;
    Scan scan = {0, NO_OFFSET, 0, {NULL, 0, 0}};
    Failure failure = {FAIL_NONE, ""};
    memset(&held, 0, sizeof held);
    if (!PyArg_ParseTuple(args, "Opp", &buf, &skip_control, &verify_crc))
        return NULL;
    if (hold(buf, NULL, &held)) {
        release_held(&held);
        return NULL;
    }
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = scan_batches(held.input.buf, (size_t)held.input.len, skip_control, verify_crc, &scan,
                          &failure);
    Py_END_ALLOW_THREADS
    release_held(&held);
    if (status < 0) {
        free(scan.compressed_spans.data);
        return raise_failure(&failure);
    }
    PyObject *spans = buf_to_owned(&scan.compressed_spans);
    if (spans == NULL)
        return NULL;
    return Py_BuildValue("LLnN", (long long)scan.record_count, (long long)scan.next_offset,
                         (Py_ssize_t)scan.bytes_consumed, spans);
}

/* Run a visitor over the records without the GIL; bufs are freed on failure. */
static int run_walk(PyObject *args, RecordVisitor visit, void *state, Buf *bufs, int buf_count)
{
    PyObject *buf, *sections;
    int skip_control, status = -1;
    Held held;
    Failure failure = {FAIL_NONE, ""};
    memset(&held, 0, sizeof held);
    if (PyArg_ParseTuple(args, "OOp", &buf, &sections, &skip_control) &&
        hold(buf, sections, &held) == 0) {
        Input in = input_of(&held, skip_control);
        Py_BEGIN_ALLOW_THREADS
        status = walk_records(&in, visit, state, &failure);
        Py_END_ALLOW_THREADS
        if (status < 0)
            raise_failure(&failure);
    }
    release_held(&held);
    if (status < 0) {
        free_bufs(bufs, buf_count);
        return -1;
    }
    return 0;
}

static PyObject *py_decode_columns(PyObject *self, PyObject *args)
{
    (void)self;
    Columns columns;
    memset(&columns, 0, sizeof columns);
    Buf *bufs = column(&columns, 0);
    Failure failure = {FAIL_NONE, ""};
    Buf *starts[] = {&columns.key_offsets, &columns.value_offsets, &columns.header_list_offsets,
                     &columns.header_key_offsets, &columns.header_value_offsets};
    for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++) {
        if (put_i32(starts[i], 0)) {
            free_bufs(bufs, COLUMN_COUNT);
            fail_no_memory(&failure);
            return raise_failure(&failure);
        }
    }
    if (run_walk(args, visit_columns, &columns, bufs, COLUMN_COUNT))
        return NULL;
    return bufs_to_tuple(bufs, COLUMN_COUNT);
}

/* ------------------------------------------------------------------ Arrow columns in place */

/* decode_arrow's output: caller-provided, fixed-capacity buffers laid out as Arrow wants
 * them (little-endian), filled with the records of [from_offset, until_offset) -- the Spark
 * source's columns without headers. Key and value are Arrow binary columns (int32 offsets,
 * validity bitmap with bit i set for a non-null value, data); offsets and timestamps (in
 * microseconds) are int64, timestamp types int32 (0 CreateTime, 1 LogAppendTime). */
typedef struct {
    int64_t *offsets, *timestamps_us;
    int32_t *timestamp_types, *key_offsets, *value_offsets;
    uint8_t *key_validity, *value_validity, *key_data, *value_data;
    size_t row_capacity, key_capacity, value_capacity;
    size_t rows, key_bytes, value_bytes, key_nulls, value_nulls;
    int64_t from_offset, until_offset;
} ArrowFill;

#define ARROW_BUFFER_COUNT 9
#define MICROS_PER_MILLI 1000

/* Append one binary value at row a->rows: its bytes, its end offset and its validity bit. */
static int fill_binary(uint8_t *data, size_t capacity, size_t *used, int32_t *offsets,
                       uint8_t *validity, size_t row, size_t *nulls, Bytes v, Failure *f)
{
    if (v.len > 0) {
        if ((size_t)v.len > capacity - *used)
            return fail(f, FAIL_USAGE, "record data exceeds the %zu bytes given", capacity);
        memcpy(data + *used, v.data, (size_t)v.len);
        *used += (size_t)v.len;
    }
    if (*used > INT32_MAX)
        return fail(f, FAIL_TOO_LARGE,
                    "more than %d bytes in one column: decode fewer batches at a time",
                    INT32_MAX);
    offsets[row + 1] = (int32_t)*used;
    if ((row & 7) == 0)
        validity[row >> 3] = 0;
    if (v.len >= 0)
        validity[row >> 3] |= (uint8_t)(1u << (row & 7));
    else
        (*nulls)++;
    return 0;
}

static int visit_arrow(void *state, const Batch *b, const Record *r, Failure *f)
{
    ArrowFill *a = state;
    int64_t offset = record_offset(b, r);
    if (offset < a->from_offset || offset >= a->until_offset)
        return 0;
    if (a->rows >= a->row_capacity)
        return fail(f, FAIL_USAGE, "more records than the %zu rows given", a->row_capacity);
    int log_append_time = (b->attributes & ATTR_LOG_APPEND_TIME) != 0;
    int64_t timestamp_ms = log_append_time
                               ? b->max_timestamp
                               : (int64_t)((uint64_t)b->base_timestamp +
                                           (uint64_t)r->timestamp_delta);
    size_t row = a->rows;
    a->offsets[row] = offset;
    a->timestamps_us[row] = (int64_t)((uint64_t)timestamp_ms * MICROS_PER_MILLI);
    a->timestamp_types[row] = log_append_time;
    if (fill_binary(a->key_data, a->key_capacity, &a->key_bytes, a->key_offsets,
                    a->key_validity, row, &a->key_nulls, r->key, f) ||
        fill_binary(a->value_data, a->value_capacity, &a->value_bytes, a->value_offsets,
                    a->value_validity, row, &a->value_nulls, r->value, f))
        return -1;
    a->rows++;
    return 0;
}

static size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

/* Point the fill at the nine writable buffers; rows fit the smallest per-row buffer. */
static void arrow_fill_init(ArrowFill *a, Py_buffer *out)
{
    a->offsets = out[0].buf;
    a->timestamps_us = out[1].buf;
    a->timestamp_types = out[2].buf;
    a->key_offsets = out[3].buf;
    a->key_validity = out[4].buf;
    a->key_data = out[5].buf;
    a->value_offsets = out[6].buf;
    a->value_validity = out[7].buf;
    a->value_data = out[8].buf;
    size_t rows = min_size((size_t)out[0].len / 8, (size_t)out[1].len / 8);
    rows = min_size(rows, (size_t)out[2].len / 4);
    rows = min_size(rows, (size_t)out[4].len * 8);
    rows = min_size(rows, (size_t)out[7].len * 8);
    size_t offset_slots = min_size((size_t)out[3].len / 4, (size_t)out[6].len / 4);
    a->row_capacity = offset_slots ? min_size(rows, offset_slots - 1) : 0;
    a->key_capacity = (size_t)out[5].len;
    a->value_capacity = (size_t)out[8].len;
    if (offset_slots) {
        a->key_offsets[0] = 0;
        a->value_offsets[0] = 0;
    }
}

static PyObject *py_decode_arrow(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *buf, *sections;
    int skip_control, verify_crc, parsed, status = -1;
    long long from_offset, until_offset;
    Py_buffer out[ARROW_BUFFER_COUNT];
    Held held;
    ArrowFill fill;
    Failure failure = {FAIL_NONE, ""};
    memset(out, 0, sizeof out);
    memset(&held, 0, sizeof held);
    memset(&fill, 0, sizeof fill);
    parsed = PyArg_ParseTuple(args, "OOppLL(w*w*w*w*w*w*w*w*w*)", &buf, &sections, &skip_control,
                              &verify_crc, &from_offset, &until_offset, &out[0], &out[1],
                              &out[2], &out[3], &out[4], &out[5], &out[6], &out[7], &out[8]);
    if (parsed && hold(buf, sections, &held) == 0) {
        arrow_fill_init(&fill, out);
        fill.from_offset = from_offset;
        fill.until_offset = until_offset;
        WalkScope scope = {verify_crc, from_offset, until_offset};
        Input in = input_of(&held, skip_control);
        Py_BEGIN_ALLOW_THREADS
        status = walk_scoped(&in, &scope, visit_arrow, &fill, &failure);
        Py_END_ALLOW_THREADS
        if (status < 0)
            raise_failure(&failure);
    }
    release_held(&held);
    for (int i = 0; i < ARROW_BUFFER_COUNT; i++)
        if (out[i].obj)
            PyBuffer_Release(&out[i]);
    if (status < 0)
        return NULL;
    return Py_BuildValue("nnnnn", (Py_ssize_t)fill.rows, (Py_ssize_t)fill.key_bytes,
                         (Py_ssize_t)fill.value_bytes, (Py_ssize_t)fill.key_nulls,
                         (Py_ssize_t)fill.value_nulls);
}

static PyObject *py_hash_keys(PyObject *self, PyObject *args)
{
    (void)self;
    KeyHashes hashes;
    memset(&hashes, 0, sizeof hashes);
    Buf *bufs = (Buf *)&hashes;
    int buf_count = sizeof hashes / sizeof(Buf);
    if (run_walk(args, visit_key_hash, &hashes, bufs, buf_count))
        return NULL;
    return bufs_to_tuple(bufs, buf_count);
}

/* walk_records(chunk, pos, records_left, previous_delta, last_offset_delta) -> (pos,
 * records_walked, previous_delta, first_keyless_delta, stop): the produce-time walk of a
 * compressed batch's records over one inflated chunk (records.walk_records_section). Reads
 * whole records from `pos`, each fully validated as read_record does, with offset deltas
 * increasing and at most last_offset_delta, until records_left are walked (stop 0), the next
 * record is not wholly in the chunk (stop 1: the caller joins chunks) or one is malformed
 * (stop 2, `pos` at its start). first_keyless_delta: the offset delta of the first record
 * without a key walked here, or -1. Holds the GIL: chunks are at most 1 MiB. */
enum { WALK_DONE = 0, WALK_NEED_MORE = 1, WALK_MALFORMED = 2 };

static PyObject *py_walk_records(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer chunk;
    Py_ssize_t pos;
    long long records_left, previous_delta, last_offset_delta;
    if (!PyArg_ParseTuple(args, "y*nLLL", &chunk, &pos, &records_left, &previous_delta,
                          &last_offset_delta))
        return NULL;
    if (pos < 0 || pos > chunk.len) {
        PyBuffer_Release(&chunk);
        PyErr_SetString(PyExc_ValueError, "pos outside the chunk");
        return NULL;
    }
    const uint8_t *start = chunk.buf, *end = start + chunk.len, *p = start + pos;
    long long walked = 0, keyless_delta = -1;
    int stop = WALK_DONE;
    while (walked < records_left) {
        Cursor length_cursor = {p, end};
        int32_t length;
        if (read_varint(&length_cursor, &length)) {
            /* an incomplete varint at the chunk's end may complete in the next one */
            stop = end - p < 5 ? WALK_NEED_MORE : WALK_MALFORMED;
            break;
        }
        if (length > 0 && length > end - length_cursor.p) {
            stop = WALK_NEED_MORE;
            break;
        }
        Cursor c = {p, end};
        Record r;
        if (length <= 0 || read_record(&c, &r) || r.offset_delta <= previous_delta ||
            r.offset_delta > last_offset_delta) {
            stop = WALK_MALFORMED;
            break;
        }
        if (r.key.len < 0 && keyless_delta < 0)
            keyless_delta = r.offset_delta;
        previous_delta = r.offset_delta;
        p = c.p;
        walked++;
    }
    PyBuffer_Release(&chunk);
    return Py_BuildValue("nLLLi", (Py_ssize_t)(p - start), walked, previous_delta, keyless_delta,
                         stop);
}

static PyObject *py_murmur3_x64_128(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer data;
    unsigned int seed;
    uint64_t hash[2];
    if (!PyArg_ParseTuple(args, "y*I", &data, &seed))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    murmur3_x64_128(data.buf, (size_t)data.len, seed, hash);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return Py_BuildValue("KK", (unsigned long long)hash[0], (unsigned long long)hash[1]);
}

static PyObject *raise_record_errors(const RecordErrors *errs)
{
    const RecordError *errors = (const RecordError *)errs->errors.data;
    Py_ssize_t count = (Py_ssize_t)(errs->errors.len / sizeof(RecordError));
    PyObject *items = PyTuple_New(count);
    for (Py_ssize_t i = 0; items != NULL && i < count; i++) {
        PyObject *item = Py_BuildValue("(iiLi)", (int)errors[i].index, (int)errors[i].kind,
                                       (long long)errors[i].timestamp,
                                       (int)errors[i].offset_delta);
        if (item == NULL)
            Py_CLEAR(items);
        else
            PyTuple_SET_ITEM(items, i, item);
    }
    if (items == NULL)
        return NULL;
    PyObject *args = Py_BuildValue("(LNL)", (long long)errs->batch_position, items,
                                   (long long)errs->total);
    if (args != NULL)
        PyErr_SetObject(records_rejected_error, args);
    Py_XDECREF(args);
    return NULL;
}

static PyObject *raise_validation_failure(const Failure *f, RecordErrors *errs)
{
    PyObject *result = f->kind == FAIL_RECORD_ERRORS ? raise_record_errors(errs)
                                                      : raise_failure(f);
    free(errs->errors.data);
    errs->errors = (Buf){0};
    return result;
}

/* checks tuple (compacted, check_timestamps, from_client, now_ms, before_max_ms,
 * after_max_ms) -> RecordChecks; 0 or -1 with a TypeError. */
static int record_checks_from(PyObject *arg, RecordChecks *c)
{
    if (!PyTuple_Check(arg) || PyTuple_GET_SIZE(arg) != 6) {
        PyErr_SetString(PyExc_TypeError, "checks is (compacted, check_timestamps, from_client, "
                        "now_ms, before_max_ms, after_max_ms)");
        return -1;
    }
    long long v[6];
    for (Py_ssize_t i = 0; i < 6; i++)
        v[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(arg, i));
    if (PyErr_Occurred())
        return -1;
    c->compacted = v[0] != 0;
    c->check_timestamps = v[1] != 0;
    c->from_client = v[2] != 0;
    c->earliest_ms = saturating_add(v[3], v[4] == LLONG_MIN ? LLONG_MAX : -v[4]);
    c->latest_ms = saturating_add(v[3], v[5]);
    return 0;
}

/* The caller's buffer, writable if it allows (then *writable points at it), else read-only. */
static int get_buffer_maybe_writable(PyObject *obj, Py_buffer *view, uint8_t **writable)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) == 0) {
        *writable = view->buf;
        return 0;
    }
    PyErr_Clear();
    *writable = NULL;
    return PyObject_GetBuffer(obj, view, PyBUF_SIMPLE);
}

static PyObject *summaries_to_tuple(const BatchSummary *summaries, size_t count)
{
    PyObject *result = PyTuple_New((Py_ssize_t)count);
    for (size_t i = 0; result != NULL && i < count; i++) {
        const BatchSummary *s = &summaries[i];
        const int64_t fields[BATCH_SUMMARY_FIELDS] = {
            s->position, s->size_bytes, s->attributes, s->last_offset_delta,
            s->base_timestamp, s->max_timestamp, s->producer_id, s->records_count};
        PyObject *item = PyTuple_New(BATCH_SUMMARY_FIELDS);
        for (int field = 0; item != NULL && field < BATCH_SUMMARY_FIELDS; field++) {
            PyObject *value = PyLong_FromLongLong((long long)fields[field]);
            if (value == NULL)
                Py_CLEAR(item);
            else
                PyTuple_SET_ITEM(item, field, value);
        }
        if (item == NULL)
            Py_CLEAR(result);
        else
            PyTuple_SET_ITEM(result, (Py_ssize_t)i, item);
    }
    return result;
}

static PyObject *py_validate_batches(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    RecordChecks checks;
    const RecordChecks *checks_used = NULL;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "validate_batches(buf, checks=None)");
        return NULL;
    }
    if (nargs == 2 && args[1] != Py_None) {
        if (record_checks_from(args[1], &checks) < 0)
            return NULL;
        checks_used = &checks;
    }
    Py_buffer view;
    uint8_t *writable;
    BatchSummary *summaries = NULL;
    size_t count = 0;
    Failure failure = {FAIL_NONE, ""};
    RecordErrors errs = {{NULL, 0, 0}, -1, 0};
    if (get_buffer_maybe_writable(args[0], &view, &writable) < 0)
        return NULL;
    int status;
    if (view.len >= VALIDATE_GIL_RELEASE_MIN_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        status = validate_all(writable, view.buf, (size_t)view.len, checks_used, &errs,
                              &summaries, &count, &failure);
        Py_END_ALLOW_THREADS
    } else {
        status = validate_all(writable, view.buf, (size_t)view.len, checks_used, &errs,
                              &summaries, &count, &failure);
    }
    PyBuffer_Release(&view);
    if (status < 0)
        return raise_validation_failure(&failure, &errs);
    PyObject *result = summaries_to_tuple(summaries, count);
    free(summaries);
    return result;
}

/* check_compressed_records(buf, position, records, checks) -> max_timestamp: Kafka's batch and
 * record checks of the compressed batch at `position` of buf (already CRC-checked by
 * validate_batches), whose decompressed records are `records`. The header's max_timestamp is
 * rewritten (with its CRC) when it differs and buf is writable. */
static PyObject *py_check_compressed_records(PyObject *self, PyObject *const *args,
                                             Py_ssize_t nargs)
{
    (void)self;
    RecordChecks checks;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "check_compressed_records(buf, position, records, "
                        "checks)");
        return NULL;
    }
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    if ((position == -1 && PyErr_Occurred()) || record_checks_from(args[3], &checks) < 0)
        return NULL;
    Py_buffer view, section;
    uint8_t *writable;
    if (get_buffer_maybe_writable(args[0], &view, &writable) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[2], &section, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Failure failure = {FAIL_NONE, ""};
    RecordErrors errs = {{NULL, 0, 0}, -1, 0};
    int64_t max_timestamp = NO_TIMESTAMP;
    int status = -1;
    if (position < 0 || view.len - position < BATCH_HEADER_BYTES) {
        fail(&failure, FAIL_USAGE, "no batch header at %lld", (long long)position);
    } else {
        const uint8_t *p = (const uint8_t *)view.buf + position;
        size_t size_bytes = (size_t)(int32_t)be32(p + 8) + LOG_OVERHEAD_BYTES;
        Cursor records = {section.buf, (const uint8_t *)section.buf + section.len};
        Py_BEGIN_ALLOW_THREADS
        status = check_batch_fields(p, (size_t)position, &checks, &failure);
        if (status == 0)
            status = check_records(records, p, (size_t)position, &checks, &max_timestamp, &errs,
                                   &failure);
        Py_END_ALLOW_THREADS
        if (status == 0 && writable != NULL && size_bytes <= (size_t)(view.len - position) &&
            needs_max_timestamp_rewrite(p, max_timestamp))
            set_batch_max_timestamp(writable + position, size_bytes, max_timestamp);
    }
    PyBuffer_Release(&section);
    PyBuffer_Release(&view);
    if (status < 0)
        return raise_validation_failure(&failure, &errs);
    return PyLong_FromLongLong(max_timestamp);
}

/* ------------------------------------------------------------------ lz4 sections */

/* A compressed lz4 batch is inflated with liblz4's frame decoder straight into the caller's
 * section buffer, one block per decoder call, and its records are checked after each call
 * while the block just written is still in the CPU caches: one pass over the section instead
 * of an inflate and then a walk, and no Python between the two. Only a section that inflates
 * completely is answered for; anything else (data liblz4 refuses, a truncated frame, output
 * not fitting the buffer with a byte to spare) is declined, and the caller's general path,
 * which decodes the same way, raises the precise error. So a record error found before a
 * later block turns out undecodable is never reported: as on the general path, data that
 * does not decode is CorruptMessage first. */

#define LZ4_CODEC_ID 3
/* Release the GIL for sections from this many compressed bytes (~0.1 ms of inflating). */
#define LZ4_GIL_RELEASE_MIN_PAYLOAD_BYTES (64 * 1024)

/* Each thread's frame decoder: created on its first lz4 batch, reset before each, freed when
 * the thread exits (its key's destructor). A context allocates its block buffers once (up to
 * twice the largest block size a frame declares, 4 MiB), not once per batch. One left in the
 * middle of a frame (refused or cut-short data) is freed instead of reused: liblz4 1.9.4's
 * reset keeps the remaining content size of such a frame, and the next frame without a
 * content size would then be refused as the wrong size. */
static pthread_key_t lz4_decoder_key;

static void free_lz4_decoder(void *decoder) { LZ4F_freeDecompressionContext(decoder); }

static LZ4F_dctx *thread_lz4_decoder(void)
{
    LZ4F_dctx *decoder = pthread_getspecific(lz4_decoder_key);
    if (decoder != NULL) {
        LZ4F_resetDecompressionContext(decoder);
        return decoder;
    }
    if (LZ4F_isError(LZ4F_createDecompressionContext(&decoder, LZ4F_VERSION)))
        return NULL;
    if (pthread_setspecific(lz4_decoder_key, decoder) != 0) {
        LZ4F_freeDecompressionContext(decoder);
        return NULL;
    }
    return decoder;
}

static void discard_thread_lz4_decoder(void)
{
    LZ4F_freeDecompressionContext(pthread_getspecific(lz4_decoder_key));
    pthread_setspecific(lz4_decoder_key, NULL);
}

typedef struct {
    const uint8_t *payload; /* the batch's LZ4 frames */
    size_t payload_len;
    uint8_t *out; /* the section buffer */
    size_t out_len;
} Lz4Section;

enum { LZ4_SECTION_INFLATED = 0, LZ4_SECTION_DECLINED = 1 };

/* Inflate every frame of s->payload into s->out, advancing `walk` over the records after each
 * decoder call; the first walk failure stops the walk (*walk_failed, in walk_failure) but not
 * the inflating. LZ4_SECTION_INFLATED with *written, or LZ4_SECTION_DECLINED. */
static int inflate_lz4_walking(LZ4F_dctx *decoder, const Lz4Section *s, RecordsWalk *walk,
                               RecordErrors *errs, Failure *walk_failure, int *walk_failed,
                               size_t *written)
{
    size_t in_pos = 0, out_pos = 0;
    /* the smallest frame header first: liblz4 then asks for the rest of the header and each
     * block whole, and decodes the block from the payload itself, never a copy of it */
    size_t next_input_bytes = LZ4F_HEADER_SIZE_MIN, frame_unfinished = 1;
    while (in_pos < s->payload_len) {
        size_t in_bytes = s->payload_len - in_pos;
        size_t out_bytes = s->out_len - out_pos;
        if (in_bytes > next_input_bytes)
            in_bytes = next_input_bytes; /* one block per call: walked while in cache */
        frame_unfinished = LZ4F_decompress(decoder, s->out + out_pos, &out_bytes,
                                           s->payload + in_pos, &in_bytes, NULL);
        if (LZ4F_isError(frame_unfinished) || (in_bytes == 0 && out_bytes == 0))
            return LZ4_SECTION_DECLINED;
        in_pos += in_bytes;
        out_pos += out_bytes;
        if (out_pos >= s->out_len)
            return LZ4_SECTION_DECLINED; /* too large: the buffer keeps a byte to spare */
        if (out_bytes && !*walk_failed &&
            records_walk_advance(walk, s->out + out_pos, 1, errs, walk_failure))
            *walk_failed = 1;
        /* 0: a frame ended; another may follow */
        next_input_bytes = frame_unfinished ? frame_unfinished : LZ4F_HEADER_SIZE_MIN;
    }
    if (frame_unfinished)
        return LZ4_SECTION_DECLINED; /* no input, or a frame cut short */
    *written = out_pos;
    return LZ4_SECTION_INFLATED;
}

/* Inflate and check the lz4 batch whose header is at p: LZ4_SECTION_DECLINED, or
 * LZ4_SECTION_INFLATED with *written and either 0 (*max_timestamp set) or -1 in *checked
 * (f set: the batch's first record failure, as check_records reports it). */
static int check_lz4_section(const uint8_t *p, size_t pos, const Lz4Section *s,
                             const RecordChecks *checks, RecordErrors *errs, Failure *f,
                             int *checked, int64_t *max_timestamp, size_t *written)
{
    LZ4F_dctx *decoder = thread_lz4_decoder();
    if (decoder == NULL) {
        *checked = fail_no_memory(f);
        return LZ4_SECTION_INFLATED;
    }
    RecordsWalk walk;
    records_walk_start(&walk, s->out, p, pos, checks);
    int walk_failed = 0;
    if (inflate_lz4_walking(decoder, s, &walk, errs, f, &walk_failed, written)) {
        discard_thread_lz4_decoder();
        return LZ4_SECTION_DECLINED;
    }
    if (!walk_failed && records_walk_advance(&walk, s->out + *written, 0, errs, f))
        walk_failed = 1;
    *checked = walk_failed ? -1 : 0;
    *max_timestamp = walk.max;
    return LZ4_SECTION_INFLATED;
}

/* check_lz4_records(buf, position, out, checks) -> (max_timestamp, section_bytes) or None:
 * check_compressed_records for the lz4 batch at `position`, its section inflated into the
 * writable buffer `out` as it is checked; None (declined) when the section does not inflate
 * into `out` with a byte to spare. The header's max timestamp is rewritten likewise. */
static PyObject *py_check_lz4_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    RecordChecks checks;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "check_lz4_records(buf, position, out, checks)");
        return NULL;
    }
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    if ((position == -1 && PyErr_Occurred()) || record_checks_from(args[3], &checks) < 0)
        return NULL;
    Py_buffer view, out;
    uint8_t *writable;
    if (get_buffer_maybe_writable(args[0], &view, &writable) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[2], &out, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Failure failure = {FAIL_NONE, ""};
    RecordErrors errs = {{NULL, 0, 0}, -1, 0};
    int64_t max_timestamp = NO_TIMESTAMP;
    int status = -1, outcome = LZ4_SECTION_INFLATED;
    size_t written = 0;
    const uint8_t *p = NULL;
    size_t size_bytes = 0;
    if (position >= 0 && view.len - position >= BATCH_HEADER_BYTES) {
        p = (const uint8_t *)view.buf + position;
        size_bytes = (size_t)(int32_t)be32(p + 8) + LOG_OVERHEAD_BYTES;
    }
    if (p == NULL || size_bytes < BATCH_HEADER_BYTES ||
        size_bytes > (size_t)(view.len - position) ||
        (p[22] & ATTR_COMPRESSION_MASK) != LZ4_CODEC_ID) {
        fail(&failure, FAIL_USAGE, "no whole lz4 batch at %lld", (long long)position);
    } else if (check_batch_fields(p, (size_t)position, &checks, &failure) == 0) {
        Lz4Section section = {p + BATCH_HEADER_BYTES, size_bytes - BATCH_HEADER_BYTES, out.buf,
                              (size_t)out.len};
        if (section.payload_len >= LZ4_GIL_RELEASE_MIN_PAYLOAD_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            outcome = check_lz4_section(p, (size_t)position, &section, &checks, &errs,
                                        &failure, &status, &max_timestamp, &written);
            Py_END_ALLOW_THREADS
        } else {
            outcome = check_lz4_section(p, (size_t)position, &section, &checks, &errs,
                                        &failure, &status, &max_timestamp, &written);
        }
    }
    if (outcome == LZ4_SECTION_INFLATED && status == 0 && writable != NULL &&
        needs_max_timestamp_rewrite(p, max_timestamp))
        set_batch_max_timestamp(writable + position, size_bytes, max_timestamp);
    PyBuffer_Release(&out);
    PyBuffer_Release(&view);
    if (outcome == LZ4_SECTION_DECLINED) {
        free(errs.errors.data);
        Py_RETURN_NONE;
    }
    if (status < 0)
        return raise_validation_failure(&failure, &errs);
    return Py_BuildValue("(Ln)", (long long)max_timestamp, (Py_ssize_t)written);
}

static PyObject *py_crc32c_interleaved(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc = ~crc32c_fast_update(~0u, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* first_batch_outside_limits: the produce checks on validate_batches' summaries that the
 * topic config decides, in one call instead of a Python loop per batch. Returns the index of
 * the first summary whose batch is larger than max_message_bytes, whose records_count is not
 * last_offset_delta + 1 >= 1, or (when check_timestamps) whose base or max timestamp is not
 * -1 and lies more than before_max_ms before or after_max_ms after now_ms; -1 when every
 * batch passes. The caller names the precise error from that batch's summary. */
#define SUMMARY_FIELDS 8

static int summary_fields(PyObject *summary, long long out[SUMMARY_FIELDS])
{
    if (!PyTuple_Check(summary) || PyTuple_GET_SIZE(summary) != SUMMARY_FIELDS) {
        PyErr_SetString(PyExc_TypeError, "a summary is a tuple of 8 ints");
        return -1;
    }
    for (Py_ssize_t field = 0; field < SUMMARY_FIELDS; field++) {
        out[field] = PyLong_AsLongLong(PyTuple_GET_ITEM(summary, field));
        if (out[field] == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}
static PyObject *py_first_batch_outside_limits(PyObject *self, PyObject *const *args,
                                               Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6 || !PyTuple_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "first_batch_outside_limits(summaries: tuple, "
                        "max_message_bytes, now_ms, before_max_ms, after_max_ms, "
                        "check_timestamps)");
        return NULL;
    }
    long long max_message_bytes = PyLong_AsLongLong(args[1]);
    long long now_ms = PyLong_AsLongLong(args[2]);
    long long before_max_ms = PyLong_AsLongLong(args[3]);
    long long after_max_ms = PyLong_AsLongLong(args[4]);
    int check_timestamps = PyObject_IsTrue(args[5]);
    if (PyErr_Occurred() || check_timestamps < 0)
        return NULL;
    BatchLimits limits = batch_limits(max_message_bytes, now_ms, before_max_ms, after_max_ms);
    Py_ssize_t count = PyTuple_GET_SIZE(args[0]);
    for (Py_ssize_t i = 0; i < count; i++) {
        long long f[SUMMARY_FIELDS];
        if (summary_fields(PyTuple_GET_ITEM(args[0], i), f) < 0)
            return NULL;
        if (outside_limits(&limits, f[1], f[3], f[7], f[4], f[5], check_timestamps))
            return PyLong_FromSsize_t(i);
    }
    return PyLong_FromLong(-1);
}

static PyMethodDef kernel_methods[] = {
    {"scan", py_scan, METH_VARARGS,
     "scan(buf, skip_control, verify_crc) -> (record_count, next_offset, bytes_consumed, "
     "compressed_spans): header-only pass; spans are int64 (start, end, codec) triples."},
    {"decode_columns", py_decode_columns, METH_VARARGS,
     "decode_columns(buf, sections, skip_control) -> tuple of 15 read-only column buffers."},
    {"decode_arrow", py_decode_arrow, METH_VARARGS,
     "decode_arrow(buf, sections, skip_control, verify_crc, from_offset, until_offset, "
     "(offsets, timestamps_us, timestamp_types, key_offsets, key_validity, key_data, "
     "value_offsets, value_validity, value_data)) -> (rows, key_bytes, value_bytes, key_nulls, "
     "value_nulls): the records of [from_offset, until_offset) written into nine writable "
     "Arrow-layout buffers, each batch CRC-checked just before its records are read."},
    {"hash_keys", py_hash_keys, METH_VARARGS,
     "hash_keys(buf, sections, skip_control) -> (offsets, hash_hi, hash_lo, is_tombstone, "
     "has_key) buffers."},
    {"walk_records", py_walk_records, METH_VARARGS,
     "walk_records(chunk, pos, records_left, previous_delta, last_offset_delta) -> (pos, "
     "records_walked, previous_delta, first_keyless_delta, stop)."},
    {"murmur3_x64_128", py_murmur3_x64_128, METH_VARARGS,
     "murmur3_x64_128(data, seed) -> (h1, h2) as unsigned 64-bit integers."},
    {"validate_batches", (PyCFunction)(void (*)(void))py_validate_batches, METH_FASTCALL,
     "validate_batches(buf, checks=None) -> tuple of (position, size_bytes, attributes, "
     "last_offset_delta, base_timestamp, max_timestamp, producer_id, records_count) per v2 "
     "batch; raises CorruptMessage unless buf is whole batches with magic 2 and valid "
     "CRC-32C. With checks (compacted, check_timestamps, from_client, now_ms, before_max_ms, "
     "after_max_ms) also Kafka's batch and record checks (InvalidRecord, RecordsRejected) "
     "and each uncompressed batch's max_timestamp from its records."},
    {"check_compressed_records", (PyCFunction)(void (*)(void))py_check_compressed_records,
     METH_FASTCALL,
     "check_compressed_records(buf, position, records, checks) -> max_timestamp: the batch "
     "and record checks of validate_batches for a compressed batch's decompressed records."},
    {"check_lz4_records", (PyCFunction)(void (*)(void))py_check_lz4_records, METH_FASTCALL,
     "check_lz4_records(buf, position, out, checks) -> (max_timestamp, section_bytes) or "
     "None: check_compressed_records for an lz4 batch, its section inflated into the "
     "writable buffer out as it is checked; None where it does not inflate into out."},
    {"crc32c", py_crc32c_interleaved, METH_O,
     "crc32c(buf) -> CRC-32C of buf (three interleaved hardware streams where available)."},
    {"first_batch_outside_limits", (PyCFunction)(void (*)(void))py_first_batch_outside_limits,
     METH_FASTCALL,
     "first_batch_outside_limits(summaries, max_message_bytes, now_ms, before_max_ms, "
     "after_max_ms, check_timestamps) -> index of the first batch failing the produce "
     "limits, or -1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kernel_module = {
    PyModuleDef_HEAD_INIT, "headrace.protocol._kernel",
    "Compiled record kernel; use headrace.protocol.kernel.", -1, kernel_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernel(void)
{
    crc32c_init();
    if (pthread_key_create(&lz4_decoder_key, free_lz4_decoder) != 0) {
        PyErr_SetString(PyExc_OSError, "no thread-specific key for the lz4 decoders");
        return NULL;
    }
    if (kernel_common_init() < 0)
        return NULL;
    records_rejected_error = PyErr_NewException("headrace.protocol._kernel.RecordsRejected",
                                                NULL, NULL);
    if (records_rejected_error == NULL)
        return NULL;
    PyObject *module = PyModule_Create(&kernel_module);
    if (module != NULL && PyModule_AddObjectRef(module, "RecordsRejected",
                                                records_rejected_error) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    if (module != NULL && crc32c_add_variant_constants(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
