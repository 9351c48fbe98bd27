/*
 * headrace.spark._encoder -- the Spark sink's compiled loops: Kafka v2 record batches written
 * straight from Arrow-layout columns (encode_batches), and the Java producer's default
 * partitioner (partition_rows, murmur2: Kafka's Utils.murmur2).
 *
 * Builds on the protocol layer's kernel_common.h (Buf, Failure, varints, big-endian stores)
 * and crc32c.h (each batch sealed with its CRC-32C). The Python face is
 * headrace/spark/encoder.py.
 *
 * Thread-safety: no shared mutable state after module init (the CRC tables and variant are
 * set there). The loops run with the GIL released over the column buffers the call holds (at
 * most HELD_VIEWS_MAX of them); output is collected in malloc'd buffers handed to Python as
 * read-only OwnedBuffers.
 */
#define KERNEL_MODULE_NAME "headrace.spark._encoder"
#include "../protocol/kernel_common.h"
#include "../protocol/crc32c.h"

/* ------------------------------------------------------------------ producing: batches from columns
 *
 * The Spark sink's hot loop: Kafka v2 record batches written straight from Arrow-layout
 * columns (binary: int32 offsets[n+1] + data + optional bool valid[n]; headers: the buffers of
 * list<struct<key: string, value: binary>>), and the Java producer's default partitioner. */

#define MURMUR2_SEED 0x9747b28cu
#define MURMUR2_MULTIPLIER 0x5bd1e995u
#define NO_PRODUCER_SEQUENCE (-1)
#define NO_PARTITION_LEADER_EPOCH (-1)
#define VARINT_MAX_BYTES 10
#define ENCODE_SPEC_BUFFERS 7 /* the most buffers one column specification holds */
#define ATTR_TRANSACTIONAL 0x10 /* the batch is part of a transaction (KIP-98) */

/* Kafka's Utils.murmur2 (the Java producer's key hash), as an unsigned 32-bit word. */
static uint32_t kafka_murmur2(const uint8_t *data, size_t len)
{
    uint32_t h = MURMUR2_SEED ^ (uint32_t)len;
    size_t whole = len & ~(size_t)3;
    for (size_t i = 0; i < whole; i += 4) {
        uint32_t k = (uint32_t)data[i] | (uint32_t)data[i + 1] << 8 |
                     (uint32_t)data[i + 2] << 16 | (uint32_t)data[i + 3] << 24;
        k *= MURMUR2_MULTIPLIER;
        k ^= k >> 24;
        k *= MURMUR2_MULTIPLIER;
        h *= MURMUR2_MULTIPLIER;
        h ^= k;
    }
    switch (len & 3) {
    case 3:
        h ^= (uint32_t)data[whole + 2] << 16; /* fall through */
    case 2:
        h ^= (uint32_t)data[whole + 1] << 8; /* fall through */
    case 1:
        h ^= data[whole];
        h *= MURMUR2_MULTIPLIER;
    }
    h ^= h >> 13;
    h *= MURMUR2_MULTIPLIER;
    h ^= h >> 15;
    return h;
}

/* Kafka's DefaultRecordBatch.incrementSequence: sequences wrap from INT32_MAX to 0. */
static int32_t increment_sequence(int32_t sequence, int32_t increment)
{
    if (sequence > INT32_MAX - increment)
        return increment - (INT32_MAX - sequence) - 1;
    return sequence + increment;
}

/* One binary column: row i is data[offsets[i]:offsets[i+1]], null where valid[i] == 0;
 * `offsets == NULL` is a column of nulls. */
typedef struct {
    const int32_t *offsets;
    const uint8_t *data;
    const uint8_t *valid;
    size_t data_len;
} BinaryCol;

typedef struct {
    const int32_t *list_offsets; /* [n+1] into the header entries; NULL: no headers column */
    const uint8_t *list_valid;
    BinaryCol keys, values;
    int64_t entry_count;
} HeaderCol;

/* The Python buffers a call holds while its GIL is released. */
#ifndef HELD_VIEWS_MAX /* a test build may shrink it to reach the bounds check */
#define HELD_VIEWS_MAX (4 * ENCODE_SPEC_BUFFERS)
#endif
typedef struct {
    Py_buffer views[HELD_VIEWS_MAX];
    int count;
} HeldViews;

static void release_views(HeldViews *h)
{
    for (int i = 0; i < h->count; i++)
        PyBuffer_Release(&h->views[i]);
    h->count = 0;
}

/* Hold `obj` (None allowed when `optional`): its bytes and their length. */
static int hold_view(HeldViews *h, PyObject *obj, int optional, const void **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    if (obj == Py_None && optional)
        return 0;
    if (h->count >= HELD_VIEWS_MAX) {
        PyErr_Format(PyExc_ValueError, "more than %d buffers in one call", HELD_VIEWS_MAX);
        return -1;
    }
    Py_buffer *view = &h->views[h->count];
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE))
        return -1;
    h->count++;
    *data = view->buf;
    *len = (size_t)view->len;
    return 0;
}

/* Whether a buffer of `len` bytes holds `count` int32 values (no overflow for any count). */
static int holds_int32s(size_t len, int64_t count)
{
    return count >= 0 && (uint64_t)count <= len / sizeof(int32_t);
}

/* A (offsets, data, valid or None) tuple, or None for a column of nulls, checked for
 * `rows` rows: offsets non-decreasing from >= 0 to <= len(data). */
static int hold_binary(HeldViews *h, PyObject *spec, int64_t rows, BinaryCol *col)
{
    memset(col, 0, sizeof *col);
    if (spec == Py_None)
        return 0;
    PyObject *offsets, *data, *valid;
    if (!PyArg_ParseTuple(spec, "OOO", &offsets, &data, &valid))
        return -1;
    const void *p;
    size_t len, valid_len;
    if (hold_view(h, offsets, 0, &p, &len))
        return -1;
    col->offsets = p;
    if (hold_view(h, data, 0, &p, &col->data_len))
        return -1;
    col->data = p;
    if (hold_view(h, valid, 1, &p, &valid_len))
        return -1;
    col->valid = p;
    if (rows == INT64_MAX || !holds_int32s(len, rows + 1) ||
        (col->valid && valid_len < (uint64_t)rows)) {
        PyErr_SetString(PyExc_ValueError, "a binary column is shorter than its row count");
        return -1;
    }
    for (int64_t i = 0; i < rows; i++)
        if (col->offsets[i] < 0 || col->offsets[i] > col->offsets[i + 1] ||
            (size_t)col->offsets[i + 1] > col->data_len) {
            PyErr_SetString(PyExc_ValueError, "binary column offsets out of order or bounds");
            return -1;
        }
    return 0;
}

/* (list_offsets, list_valid or None, (key column), (value column), entry_count) or None. */
static int hold_headers(HeldViews *h, PyObject *spec, int64_t rows, HeaderCol *col)
{
    memset(col, 0, sizeof *col);
    if (spec == Py_None)
        return 0;
    PyObject *offsets, *valid, *keys, *values;
    long long entries;
    if (!PyArg_ParseTuple(spec, "OOOOL", &offsets, &valid, &keys, &values, &entries))
        return -1;
    const void *p;
    size_t len, valid_len;
    if (hold_view(h, offsets, 0, &p, &len))
        return -1;
    col->list_offsets = p;
    if (hold_view(h, valid, 1, &p, &valid_len))
        return -1;
    col->list_valid = p;
    col->entry_count = entries;
    if (rows == INT64_MAX || !holds_int32s(len, rows + 1) ||
        (col->list_valid && valid_len < (uint64_t)rows) || entries < 0) {
        PyErr_SetString(PyExc_ValueError, "the headers column is shorter than its row count");
        return -1;
    }
    if (hold_binary(h, keys, entries, &col->keys) || hold_binary(h, values, entries, &col->values))
        return -1;
    if (col->keys.offsets == NULL || col->keys.valid != NULL) {
        PyErr_SetString(PyExc_ValueError, "header keys must be a column without nulls");
        return -1;
    }
    for (int64_t i = 0; i < rows; i++)
        if (col->list_offsets[i] < 0 || col->list_offsets[i] > col->list_offsets[i + 1] ||
            col->list_offsets[i + 1] > entries) {
            PyErr_SetString(PyExc_ValueError, "header list offsets out of order or bounds");
            return -1;
        }
    return 0;
}

/* Length of row i (-1: null) and its bytes. */
static int64_t binary_at(const BinaryCol *c, int64_t i, const uint8_t **bytes)
{
    if (c->offsets == NULL || (c->valid && !c->valid[i])) {
        *bytes = NULL;
        return -1;
    }
    *bytes = c->data + c->offsets[i];
    return (int64_t)c->offsets[i + 1] - c->offsets[i];
}

/* ---- partitioning (Kafka's BuiltInPartitioner without adaptive statistics) */

typedef struct {
    BinaryCol keys, values;
    const int32_t *explicit_partitions; /* -1: unassigned; NULL: all unassigned */
    int64_t rows;
    int32_t partition_count;
    int32_t sticky_partition;
    int64_t sticky_bytes, batch_bytes;
} PartitionJob;

static int partition_all(PartitionJob *j, int32_t *out, Failure *f)
{
    for (int64_t i = 0; i < j->rows; i++) {
        int32_t chosen = j->explicit_partitions ? j->explicit_partitions[i] : -1;
        if (chosen >= j->partition_count || chosen < -1)
            return fail(f, FAIL_USAGE, "row %lld names partition %d of %d", (long long)i,
                        (int)chosen, (int)j->partition_count);
        const uint8_t *key, *value;
        int64_t key_len = binary_at(&j->keys, i, &key);
        if (chosen < 0 && key_len >= 0) {
            chosen = (int32_t)((kafka_murmur2(key, (size_t)key_len) & 0x7fffffffu) %
                               (uint32_t)j->partition_count);
        } else if (chosen < 0) {
            chosen = j->sticky_partition;
            int64_t value_len = binary_at(&j->values, i, &value);
            j->sticky_bytes += (value_len > 0 ? value_len : 0) + 1;
            if (j->sticky_bytes >= j->batch_bytes) {
                j->sticky_partition = (j->sticky_partition + 1) % j->partition_count;
                j->sticky_bytes = 0;
            }
        }
        out[i] = chosen;
    }
    return 0;
}

static PyObject *py_partition_rows(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *keys, *values, *explicit_obj;
    PartitionJob j = {0};
    long long rows, sticky_bytes, batch_bytes;
    int partition_count, sticky_partition;
    if (!PyArg_ParseTuple(args, "LOOOiiLL", &rows, &keys, &values, &explicit_obj,
                          &partition_count, &sticky_partition, &sticky_bytes, &batch_bytes))
        return NULL;
    if (rows < 0 || partition_count < 1 || sticky_partition < 0 ||
        sticky_partition >= partition_count || batch_bytes < 1) {
        PyErr_SetString(PyExc_ValueError, "partition_rows: invalid counts");
        return NULL;
    }
    HeldViews held = {.count = 0};
    const void *p;
    size_t len;
    Buf out = {0};
    Failure failure = {FAIL_NONE, ""};
    PyObject *result = NULL;
    if (hold_binary(&held, keys, rows, &j.keys) || hold_binary(&held, values, rows, &j.values) ||
        hold_view(&held, explicit_obj, 1, &p, &len))
        goto done;
    if (p && !holds_int32s(len, rows)) {
        PyErr_SetString(PyExc_ValueError, "the partition column is shorter than its row count");
        goto done;
    }
    j.explicit_partitions = p;
    j.rows = rows;
    j.partition_count = partition_count;
    j.sticky_partition = sticky_partition;
    j.sticky_bytes = sticky_bytes;
    j.batch_bytes = batch_bytes;
    if ((uint64_t)rows > (SIZE_MAX - 1) / sizeof(int32_t) ||
        buf_reserve(&out, (size_t)rows * sizeof(int32_t) + 1)) {
        PyErr_NoMemory();
        goto done;
    }
    out.len = (size_t)rows * sizeof(int32_t);
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = partition_all(&j, (int32_t *)out.data, &failure);
    Py_END_ALLOW_THREADS
    if (status) {
        raise_failure(&failure);
        goto done;
    }
    PyObject *partitions = buf_to_owned(&out);
    if (partitions)
        result = Py_BuildValue("(NiL)", partitions, (int)j.sticky_partition,
                               (long long)j.sticky_bytes);
done:
    free(out.data);
    release_views(&held);
    return result;
}

static PyObject *py_murmur2(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE))
        return NULL;
    uint32_t h = kafka_murmur2(view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLong((long)(int32_t)h);
}

/* ---- encoding */

typedef struct {
    BinaryCol keys, values;
    HeaderCol headers;
    const uint8_t *extra_key, *extra_value; /* one header appended to every record, or NULL */
    size_t extra_key_len, extra_value_len;
    const int32_t *rows;
    int64_t row_count, table_rows;
    int64_t timestamp_ms, producer_id;
    int16_t producer_epoch, attributes;
    int32_t base_sequence;
    int64_t max_batch_bytes;
} EncodeJob;

static size_t varint_bytes(int64_t v) { return uvarint_bytes(zigzag64(v)); }

static uint8_t *put_varint_raw(uint8_t *p, int64_t v)
{
    uint64_t u = zigzag64(v);
    for (; u >= 0x80; u >>= 7)
        *p++ = (uint8_t)(u | 0x80);
    *p++ = (uint8_t)u;
    return p;
}

static uint8_t *put_field_raw(uint8_t *p, const uint8_t *bytes, int64_t len)
{
    p = put_varint_raw(p, len);
    if (len > 0) {
        memcpy(p, bytes, (size_t)len);
        p += len;
    }
    return p;
}

static size_t field_bytes(int64_t len) { return varint_bytes(len) + (size_t)(len > 0 ? len : 0); }

/* Start a batch header (sizes, CRC and counts are filled in by seal_batch). */
static int open_batch(const EncodeJob *j, Buf *out, int32_t base_sequence, Failure *f)
{
    uint8_t header[BATCH_HEADER_BYTES] = {0};
    put_be32_at(header + 12, (uint32_t)NO_PARTITION_LEADER_EPOCH);
    header[16] = CURRENT_MAGIC;
    put_be16_at(header + 21, (uint16_t)j->attributes);
    put_be64_at(header + 27, (uint64_t)j->timestamp_ms);
    put_be64_at(header + 35, (uint64_t)j->timestamp_ms);
    put_be64_at(header + 43, (uint64_t)j->producer_id);
    put_be16_at(header + 51, (uint16_t)j->producer_epoch);
    put_be32_at(header + 53, (uint32_t)base_sequence);
    return buf_put(out, header, BATCH_HEADER_BYTES) ? fail_no_memory(f) : 0;
}

/* Fill in the batch at `start` holding `records` records; CRC-32C only when uncompressed
 * (compressed batches are sealed after compression). */
static void seal_batch(const EncodeJob *j, Buf *out, size_t start, int32_t records)
{
    uint8_t *p = out->data + start;
    put_be32_at(p + 8, (uint32_t)(out->len - start - LOG_OVERHEAD_BYTES));
    put_be32_at(p + 23, (uint32_t)(records - 1));
    put_be32_at(p + 57, (uint32_t)records);
    if ((j->attributes & ATTR_COMPRESSION_MASK) == 0)
        put_be32_at(p + 17, ~crc32c_fast_update(~0u, p + CRC_COVERED_FROM,
                                                out->len - start - CRC_COVERED_FROM));
}

/* Bytes of one record's body (after its length) at offset delta `delta`. */
static size_t record_body_bytes(const EncodeJob *j, int64_t row, int32_t delta, int64_t *header_count)
{
    const uint8_t *unused;
    size_t n = 1 + 1 + varint_bytes(delta); /* attributes, timestamp delta 0, offset delta */
    n += field_bytes(binary_at(&j->keys, row, &unused));
    n += field_bytes(binary_at(&j->values, row, &unused));
    int64_t first = 0, end = 0;
    const HeaderCol *h = &j->headers;
    if (h->list_offsets && !(h->list_valid && !h->list_valid[row])) {
        first = h->list_offsets[row];
        end = h->list_offsets[row + 1];
    }
    for (int64_t e = first; e < end; e++)
        n += field_bytes(binary_at(&h->keys, e, &unused)) +
             field_bytes(binary_at(&h->values, e, &unused));
    *header_count = end - first;
    if (j->extra_key) {
        n += field_bytes((int64_t)j->extra_key_len) + field_bytes((int64_t)j->extra_value_len);
        (*header_count)++;
    }
    return n + varint_bytes(*header_count);
}

static uint8_t *put_record_raw(const EncodeJob *j, uint8_t *p, int64_t row, int32_t delta,
                               size_t body, int64_t header_count)
{
    const uint8_t *bytes;
    p = put_varint_raw(p, (int64_t)body);
    *p++ = 0; /* record attributes */
    *p++ = 0; /* timestamp delta: every record of the batch has the batch's timestamp */
    p = put_varint_raw(p, delta);
    int64_t len = binary_at(&j->keys, row, &bytes);
    p = put_field_raw(p, bytes, len);
    len = binary_at(&j->values, row, &bytes);
    p = put_field_raw(p, bytes, len);
    p = put_varint_raw(p, header_count);
    const HeaderCol *h = &j->headers;
    if (h->list_offsets && !(h->list_valid && !h->list_valid[row]))
        for (int64_t e = h->list_offsets[row]; e < h->list_offsets[row + 1]; e++) {
            len = binary_at(&h->keys, e, &bytes);
            p = put_field_raw(p, bytes, len);
            len = binary_at(&h->values, e, &bytes);
            p = put_field_raw(p, bytes, len);
        }
    if (j->extra_key) {
        p = put_field_raw(p, j->extra_key, (int64_t)j->extra_key_len);
        p = put_field_raw(p, j->extra_value, (int64_t)j->extra_value_len);
    }
    return p;
}

/* Encode every selected row into batches of at most max_batch_bytes (a batch holds at
 * least one record); `bounds` gets int64 (start, end, records) per batch. */
static int encode_all(const EncodeJob *j, Buf *out, Buf *bounds, Failure *f)
{
    int32_t sequence = j->base_sequence;
    size_t start = 0;
    int32_t records = 0;
    for (int64_t i = 0; i < j->row_count; i++) {
        int64_t row = j->rows[i];
        if (row < 0 || row >= j->table_rows)
            return fail(f, FAIL_USAGE, "selected row %lld outside 0..%lld", (long long)row,
                        (long long)j->table_rows - 1);
        int64_t header_count;
        size_t body = record_body_bytes(j, row, records, &header_count);
        size_t record = varint_bytes((int64_t)body) + body;
        if (records && out->len - start + record > (size_t)j->max_batch_bytes) {
            seal_batch(j, out, start, records);
            int64_t bound[3] = {(int64_t)start, (int64_t)out->len, records};
            if (buf_put(bounds, bound, sizeof bound))
                return fail_no_memory(f);
            if (j->producer_id >= 0)
                sequence = increment_sequence(sequence, records);
            records = 0;
        }
        if (records == 0) {
            start = out->len;
            if (open_batch(j, out, sequence, f))
                return -1;
        }
        if (records == 0 && i > 0) { /* the offset delta changed: its size may have too */
            body = record_body_bytes(j, row, records, &header_count);
            record = varint_bytes((int64_t)body) + body;
        }
        if (out->len - start + record > INT32_MAX)
            return fail(f, FAIL_TOO_LARGE, "a record batch would exceed %d bytes", INT32_MAX);
        if (out->cap < out->len + record) {
            size_t want = out->cap ? out->cap : BUF_INITIAL_CAPACITY_BYTES;
            while (want < out->len + record)
                want *= 2;
            if (buf_reserve(out, want))
                return fail_no_memory(f);
        }
        out->len = (size_t)(put_record_raw(j, out->data + out->len, row, records, body,
                                           header_count) - out->data);
        records++;
    }
    if (records) {
        seal_batch(j, out, start, records);
        int64_t bound[3] = {(int64_t)start, (int64_t)out->len, records};
        if (buf_put(bounds, bound, sizeof bound))
            return fail_no_memory(f);
    }
    return 0;
}

static int hold_extra_header(HeldViews *h, PyObject *spec, EncodeJob *j)
{
    if (spec == Py_None)
        return 0;
    PyObject *key, *value;
    if (!PyArg_ParseTuple(spec, "OO", &key, &value))
        return -1;
    const void *p;
    if (hold_view(h, key, 0, &p, &j->extra_key_len))
        return -1;
    j->extra_key = p;
    if (hold_view(h, value, 0, &p, &j->extra_value_len))
        return -1;
    j->extra_value = p;
    return 0;
}

static PyObject *py_encode_batches(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *keys, *values, *headers, *extra, *rows_obj;
    long long table_rows, timestamp_ms, producer_id, max_batch_bytes;
    int producer_epoch, base_sequence, attributes;
    if (!PyArg_ParseTuple(args, "LOOOOOL(Lii)iL", &table_rows, &keys, &values, &headers, &extra,
                          &rows_obj, &timestamp_ms, &producer_id, &producer_epoch,
                          &base_sequence, &attributes, &max_batch_bytes))
        return NULL;
    if (table_rows < 0 || max_batch_bytes < BATCH_HEADER_BYTES) {
        PyErr_SetString(PyExc_ValueError, "encode_batches: invalid row count or batch limit");
        return NULL;
    }
    EncodeJob j = {0};
    HeldViews held = {.count = 0};
    Buf out = {0}, bounds = {0};
    Failure failure = {FAIL_NONE, ""};
    PyObject *result = NULL;
    const void *p;
    size_t rows_len;
    if (hold_binary(&held, keys, table_rows, &j.keys) ||
        hold_binary(&held, values, table_rows, &j.values) ||
        hold_headers(&held, headers, table_rows, &j.headers) ||
        hold_extra_header(&held, extra, &j) || hold_view(&held, rows_obj, 0, &p, &rows_len))
        goto done;
    j.rows = p;
    j.row_count = (int64_t)(rows_len / sizeof(int32_t));
    j.table_rows = table_rows;
    j.timestamp_ms = timestamp_ms;
    j.producer_id = producer_id;
    j.producer_epoch = (int16_t)producer_epoch;
    j.base_sequence = producer_id >= 0 ? base_sequence : NO_PRODUCER_SEQUENCE;
    j.attributes = (int16_t)(attributes & (ATTR_COMPRESSION_MASK | ATTR_TRANSACTIONAL));
    j.max_batch_bytes = max_batch_bytes;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = encode_all(&j, &out, &bounds, &failure);
    Py_END_ALLOW_THREADS
    if (status) {
        raise_failure(&failure);
        goto done;
    }
    Buf outputs[2] = {out, bounds};
    out = bounds = (Buf){0};
    result = bufs_to_tuple(outputs, 2); /* owns (or frees) the outputs */
done:
    free(out.data);
    free(bounds.data);
    release_views(&held);
    return result;
}

static PyMethodDef encoder_methods[] = {
    {"murmur2", py_murmur2, METH_O,
     "murmur2(buf) -> Kafka's murmur2 hash of buf as a signed 32-bit int (Utils.murmur2)."},
    {"partition_rows", py_partition_rows, METH_VARARGS,
     "partition_rows(rows, keys, values, explicit_partitions, partition_count, "
     "sticky_partition, sticky_bytes, batch_bytes) -> (int32 partitions, sticky_partition, "
     "sticky_bytes): the Java producer's default partitioner per row."},
    {"encode_batches", py_encode_batches, METH_VARARGS,
     "encode_batches(table_rows, keys, values, headers, extra_header, rows, timestamp_ms, "
     "(producer_id, producer_epoch, base_sequence), codec, max_batch_bytes) -> (data, "
     "bounds): v2 record batches of the selected rows; bounds are int64 (start, end, "
     "records) per batch."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef encoder_module = {
    PyModuleDef_HEAD_INIT, "headrace.spark._encoder",
    "Compiled record batch encoder and partitioner; use headrace.spark.encoder.", -1,
    encoder_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__encoder(void)
{
    crc32c_init();
    if (kernel_common_init() < 0)
        return NULL;
    PyObject *module = PyModule_Create(&encoder_module);
    if (module != NULL && (PyModule_AddIntConstant(module, "HELD_VIEWS_MAX", HELD_VIEWS_MAX) < 0 ||
                           crc32c_add_variant_constants(module) < 0)) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
