/*
 * headrace.protocol._kernel -- the compiled record kernel.
 *
 * Owns the hot per-record loops over Kafka v2 record batches: walking batch headers,
 * checking CRC-32C, parsing records (bounds-checked zigzag varints), decoding them into
 * Arrow-layout columns, hashing keys with MurmurHash3 x64 128, and validating produced
 * batches as Kafka's LogValidator does (every record parsed in the CRC pass, per-record
 * errors, the max timestamp from the records); the log's two hot I/O paths -- a plain
 * produce batch validated, its base offset patched and written to the segment descriptor in
 * one call (append_plain_batch, write_batch), and the cleaner's passes over a span of a
 * segment, reading it with pread and writing pass 2's output to the .cleaned descriptor
 * (map_span, filter_span).
 * The Python face is headrace/protocol/kernel.py: it decompresses compressed
 * record sections (one call per batch) and hands them here as `sections`, in the order
 * the walk meets the compressed batches it does not skip.
 *
 * Batch layout (big-endian): base_offset int64 @0, batch_length int32 @8, leader epoch
 * @12, magic int8 @16, crc uint32 @17 (CRC-32C of bytes 21..end), attributes int16 @21,
 * last_offset_delta int32 @23, base_timestamp int64 @27, max_timestamp int64 @35,
 * producer id/epoch/base sequence @43..56, records_count int32 @57, records @61.
 * Record: length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
 * key (varint length, -1 = null), value (same), headersCount varint, headers
 * [key length varint >= 0, key, value length varint (-1 = null), value].
 *
 * Thread-safety: no shared mutable state after module init (the CRC table is written
 * once there; the CRC-32C variant is chosen there from the CPU's features) except the time
 * of the broker's latest request (note_broker_request), one atomic word the event loop
 * stores and niced cleaner spans load (see "cooperative spans" below). Every loop and
 * every read or write runs with the GIL released over a buffer the caller holds;
 * output is collected in malloc'd buffers handed to Python as read-only OwnedBuffers
 * (decode_arrow alone writes into writable buffers the caller holds for the call).
 * Malformed input is reported as headrace.errors.CorruptMessage (produce validation: Kafka's
 * InvalidRecord where Kafka's LogValidator answers INVALID_RECORD, and RecordsRejected for
 * per-record errors), never read past.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <sys/uio.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#define LOG_OVERHEAD_BYTES 12
#define BATCH_HEADER_BYTES 61
#define CURRENT_MAGIC 2
#define ATTR_COMPRESSION_MASK 0x07
#define ATTR_LOG_APPEND_TIME 0x08
#define ATTR_CONTROL 0x20
#define CRC_COVERED_FROM 21
#define FAILURE_MESSAGE_BYTES 160
#define BUF_INITIAL_CAPACITY_BYTES 256
#define NO_OFFSET (-1)
#define NO_TIMESTAMP (-1) /* a batch or record without a timestamp */

static PyObject *corrupt_message_error; /* headrace.errors.CorruptMessage */
static PyObject *invalid_record_error;  /* headrace.errors.InvalidRecord */
static PyObject *records_rejected_error; /* _kernel.RecordsRejected: per-record errors */

/* ------------------------------------------------------------------ failures */

typedef enum {
    FAIL_NONE,
    FAIL_CORRUPT,
    FAIL_NO_MEMORY,
    FAIL_TOO_LARGE,
    FAIL_USAGE,
    FAIL_INVALID_RECORD, /* a batch Kafka's LogValidator refuses as a whole: INVALID_RECORD */
    FAIL_RECORD_ERRORS,  /* records refused one by one: the RecordErrors the caller holds */
} FailKind;

typedef struct {
    FailKind kind;
    char message[FAILURE_MESSAGE_BYTES];
} Failure;

/* Record a failure (callable without the GIL); always returns -1. */
static int fail(Failure *f, FailKind kind, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    f->kind = kind;
    vsnprintf(f->message, sizeof f->message, fmt, args);
    va_end(args);
    return -1;
}

static int fail_no_memory(Failure *f) { return fail(f, FAIL_NO_MEMORY, "out of memory"); }

/* Turn a failure into a Python exception (GIL held); returns NULL. */
static PyObject *raise_failure(const Failure *f)
{
    switch (f->kind) {
    case FAIL_NO_MEMORY:
        return PyErr_NoMemory();
    case FAIL_TOO_LARGE:
        PyErr_SetString(PyExc_OverflowError, f->message);
        return NULL;
    case FAIL_USAGE:
        PyErr_SetString(PyExc_ValueError, f->message);
        return NULL;
    case FAIL_INVALID_RECORD:
        PyErr_SetString(invalid_record_error, f->message);
        return NULL;
    default:
        PyErr_SetString(corrupt_message_error, f->message);
        return NULL;
    }
}

/* ------------------------------------------------------------------ growable output */

typedef struct {
    uint8_t *data;
    size_t len, cap;
} Buf;

static int buf_put(Buf *b, const void *src, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : BUF_INITIAL_CAPACITY_BYTES;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *grown = realloc(b->data, cap);
        if (grown == NULL)
            return -1;
        b->data = grown;
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

/* Make room for `n` bytes in all (one allocation instead of doublings). */
static int buf_reserve(Buf *b, size_t n)
{
    if (n <= b->cap)
        return 0;
    uint8_t *grown = realloc(b->data, n);
    if (grown == NULL)
        return -1;
    b->data = grown;
    b->cap = n;
    return 0;
}

static int put_i64(Buf *b, int64_t v) { return buf_put(b, &v, sizeof v); }
static int put_i32(Buf *b, int32_t v) { return buf_put(b, &v, sizeof v); }
static int put_u64(Buf *b, uint64_t v) { return buf_put(b, &v, sizeof v); }
static int put_u8(Buf *b, uint8_t v) { return buf_put(b, &v, sizeof v); }

/* A read-only buffer object owning malloc'd memory: hands a Buf to numpy without a copy
 * (copying a large fresh buffer costs as much as decoding it: page faults dominate). */
typedef struct {
    PyObject_HEAD
    uint8_t *data;
    Py_ssize_t len;
} OwnedBuffer;

static int owned_buffer_get(PyObject *self, Py_buffer *view, int flags)
{
    OwnedBuffer *owned = (OwnedBuffer *)self;
    return PyBuffer_FillInfo(view, self, owned->data, owned->len, 1, flags);
}

static void owned_buffer_dealloc(PyObject *self)
{
    free(((OwnedBuffer *)self)->data);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs owned_buffer_procs = {owned_buffer_get, NULL};

static PyTypeObject OwnedBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "headrace.protocol._kernel.OwnedBuffer",
    .tp_basicsize = sizeof(OwnedBuffer),
    .tp_dealloc = owned_buffer_dealloc,
    .tp_as_buffer = &owned_buffer_procs,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Read-only bytes produced by the record kernel.",
};

/* Move the buffer's memory into a new OwnedBuffer (trimmed to its length); the Buf is
 * left empty. Returns NULL with an exception set (and the memory freed) on failure. */
static PyObject *buf_to_owned(Buf *b)
{
    uint8_t *data;
    if (b->len == 0) {
        free(b->data);
        data = malloc(1); /* a valid pointer even for an empty column */
    } else {
        data = realloc(b->data, b->len);
        if (data == NULL)
            data = b->data; /* shrinking failed: keep the larger block */
    }
    Py_ssize_t len = (Py_ssize_t)b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    OwnedBuffer *owned = data ? PyObject_New(OwnedBuffer, &OwnedBufferType) : NULL;
    if (owned == NULL) {
        free(data);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    owned->data = data;
    owned->len = len;
    return (PyObject *)owned;
}

/* ------------------------------------------------------------------ big-endian, varints */

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t be64(const uint8_t *p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }

typedef struct {
    const uint8_t *p, *end;
} Cursor;

/* Unsigned LEB128 of at most max_bytes bytes; bits beyond 64 are dropped, as Kafka does. */
static int read_uvarint(Cursor *c, int max_bytes, uint64_t *out)
{
    uint64_t value = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (c->p >= c->end)
            return -1;
        uint8_t byte = *c->p++;
        value |= (uint64_t)(byte & 0x7f) << (7 * i);
        if (!(byte & 0x80)) {
            *out = value;
            return 0;
        }
    }
    return -1;
}

static int read_varint(Cursor *c, int32_t *out)
{
    uint64_t raw;
    if (read_uvarint(c, 5, &raw))
        return -1;
    uint32_t zigzag = (uint32_t)raw;
    *out = (int32_t)((zigzag >> 1) ^ (0u - (zigzag & 1)));
    return 0;
}

static int read_varlong(Cursor *c, int64_t *out)
{
    uint64_t zigzag;
    if (read_uvarint(c, 10, &zigzag))
        return -1;
    *out = (int64_t)((zigzag >> 1) ^ (0u - (zigzag & 1)));
    return 0;
}

/* A length-prefixed byte string; len == -1 means null. */
typedef struct {
    const uint8_t *data;
    int32_t len;
} Bytes;

static int read_bytes(Cursor *c, Bytes *out, int null_allowed)
{
    if (read_varint(c, &out->len))
        return -1;
    if (out->len < (null_allowed ? -1 : 0) || out->len > c->end - c->p)
        return -1;
    out->data = c->p;
    if (out->len > 0)
        c->p += out->len;
    return 0;
}

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

/* ------------------------------------------------------------------ batches */

typedef struct {
    int64_t base_offset, base_timestamp, max_timestamp;
    int32_t last_offset_delta, records_count;
    uint32_t crc;
    int16_t attributes;
    size_t position, size_bytes;
} Batch;

/* Read the batch header at *pos. Returns 1 (and advances *pos), 0 when no whole batch
 * remains (a trailing partial batch is ignored, as Kafka clients do), -1 if corrupt. */
static int next_batch(const uint8_t *buf, size_t len, size_t *pos, Batch *b, Failure *f)
{
    size_t remaining = len - *pos;
    const uint8_t *p = buf + *pos;
    if (remaining < LOG_OVERHEAD_BYTES)
        return 0;
    int32_t batch_length = (int32_t)be32(p + 8);
    if (batch_length < BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES)
        return fail(f, FAIL_CORRUPT, "record batch at byte %lld has length %d",
                    (long long)*pos, (int)batch_length);
    b->size_bytes = (size_t)batch_length + LOG_OVERHEAD_BYTES;
    if (remaining < b->size_bytes)
        return 0;
    if (p[16] != CURRENT_MAGIC)
        return fail(f, FAIL_CORRUPT, "record batch at byte %lld has magic %d, expected 2",
                    (long long)*pos, (int)p[16]);
    b->position = *pos;
    b->base_offset = (int64_t)be64(p);
    b->crc = be32(p + 17);
    b->attributes = (int16_t)(p[21] << 8 | p[22]);
    b->last_offset_delta = (int32_t)be32(p + 23);
    b->base_timestamp = (int64_t)be64(p + 27);
    b->max_timestamp = (int64_t)be64(p + 35);
    b->records_count = (int32_t)be32(p + 57);
    if (b->records_count < 0)
        return fail(f, FAIL_CORRUPT, "record batch at byte %lld has %d records",
                    (long long)*pos, (int)b->records_count);
    *pos += b->size_bytes;
    return 1;
}

static int64_t batch_next_offset(const Batch *b)
{
    return (int64_t)((uint64_t)b->base_offset + (uint64_t)(int64_t)b->last_offset_delta + 1);
}

static int batch_is_skipped(const Batch *b, int skip_control)
{
    return skip_control && (b->attributes & ATTR_CONTROL);
}

/* What a header-only pass learns about the whole batches in a buffer. */
typedef struct {
    int64_t record_count, next_offset;
    size_t bytes_consumed;
    Buf compressed_spans; /* int64 triples: records start, records end, codec */
} Scan;

/* The three-stream CRC-32C of the produce-validation section below (set at module init). */
static uint32_t (*crc32c_fast_update)(uint32_t, const uint8_t *, size_t);

/* 0 when the batch of size_bytes at pos matches its stored CRC-32C, else CorruptMessage. */
static int check_batch_crc(const uint8_t *buf, size_t pos, size_t size_bytes, uint32_t stored,
                           Failure *f)
{
    if (~crc32c_fast_update(~0u, buf + pos + CRC_COVERED_FROM, size_bytes - CRC_COVERED_FROM) ==
        stored)
        return 0;
    return fail(f, FAIL_CORRUPT, "record batch at byte %lld fails its CRC-32C check",
                (long long)pos);
}

static int scan_batches(const uint8_t *buf, size_t len, int skip_control, int verify_crc, Scan *s,
                        Failure *f)
{
    Batch b = {0};
    int status;
    size_t pos = 0;
    while ((status = next_batch(buf, len, &pos, &b, f)) == 1) {
        s->next_offset = batch_next_offset(&b);
        s->bytes_consumed = pos;
        if (verify_crc && check_batch_crc(buf, b.position, b.size_bytes, b.crc, f))
            return -1;
        if (batch_is_skipped(&b, skip_control))
            continue;
        s->record_count += b.records_count;
        if (b.attributes & ATTR_COMPRESSION_MASK) {
            int64_t span[3] = {(int64_t)(b.position + BATCH_HEADER_BYTES),
                               (int64_t)(b.position + b.size_bytes),
                               b.attributes & ATTR_COMPRESSION_MASK};
            if (buf_put(&s->compressed_spans, span, sizeof span))
                return fail_no_memory(f);
        }
    }
    return status;
}

/* ------------------------------------------------------------------ records */

typedef struct {
    int64_t timestamp_delta;
    int32_t offset_delta, header_count;
    Bytes key, value;
    Cursor headers; /* from the first header to the end of the record */
} Record;

/* Parse and fully validate one record, headers included. */
static int read_record(Cursor *c, Record *r)
{
    int32_t length;
    if (read_varint(c, &length) || length < 0 || length > c->end - c->p)
        return -1;
    Cursor body = {c->p, c->p + length};
    c->p += length;
    if (body.p >= body.end)
        return -1;
    body.p++; /* record attributes: unused by Kafka */
    if (read_varlong(&body, &r->timestamp_delta) || read_varint(&body, &r->offset_delta) ||
        read_bytes(&body, &r->key, 1) || read_bytes(&body, &r->value, 1) ||
        read_varint(&body, &r->header_count) || r->header_count < 0)
        return -1;
    r->headers = body;
    for (int32_t i = 0; i < r->header_count; i++) {
        Bytes header_key, header_value;
        if (read_bytes(&body, &header_key, 0) || read_bytes(&body, &header_value, 1))
            return -1;
    }
    return body.p == body.end ? 0 : -1;
}

/* Called per record; returns 0 to go on, 1 to stop the walk, -1 on failure. */
typedef int (*RecordVisitor)(void *state, const Batch *b, const Record *r, Failure *f);

typedef struct {
    const uint8_t *buf;
    size_t len;
    const Py_buffer *sections; /* decompressed records of the compressed batches, in order */
    Py_ssize_t section_count;
    int skip_control;
} Input;

static int walk_batch_records(const Batch *b, Cursor records, RecordVisitor visit, void *state,
                              Failure *f)
{
    for (int32_t i = 0; i < b->records_count; i++) {
        Record r;
        if (read_record(&records, &r))
            return fail(f, FAIL_CORRUPT, "record %d of the batch at byte %lld is malformed", (int)i,
                        (long long)b->position);
        int status = visit(state, b, &r, f);
        if (status)
            return status;
    }
    if (records.p != records.end)
        return fail(f, FAIL_CORRUPT, "record batch at byte %lld has %lld bytes after its records",
                    (long long)b->position, (long long)(records.end - records.p));
    return 0;
}

/* The records of batch b (ending at batch_end): its bytes after the header, or, for a
 * compressed batch, the next of the caller's decompressed sections (*section counts them).
 * Returns 0, or -1 with f set when fewer sections were given than compressed batches. */
static int batch_records(const Input *in, const Batch *b, size_t batch_end, Py_ssize_t *section,
                         Cursor *records, Failure *f)
{
    records->p = in->buf + b->position + BATCH_HEADER_BYTES;
    records->end = in->buf + batch_end;
    if (!(b->attributes & ATTR_COMPRESSION_MASK))
        return 0;
    if (*section >= in->section_count)
        return fail(f, FAIL_USAGE, "%lld decompressed sections given, more needed",
                    (long long)in->section_count);
    records->p = in->sections[*section].buf;
    records->end = records->p + in->sections[*section].len;
    (*section)++;
    return 0;
}

/* What a walk does beyond Input's own skips: check each batch's CRC-32C just before its
 * records are decoded (the batch is still in the CPU caches), and pass over batches wholly
 * outside [from_offset, until_offset) without parsing their records. */
typedef struct {
    int verify_crc;
    int64_t from_offset, until_offset;
} WalkScope;

static const WalkScope WALK_ALL = {0, INT64_MIN, INT64_MAX};

/* Visit every record of every whole, non-skipped batch in `scope`. Returns 0, 1 (stopped) or
 * -1. */
static int walk_scoped(const Input *in, const WalkScope *scope, RecordVisitor visit,
                       void *state, Failure *f)
{
    Batch b = {0};
    int status;
    size_t pos = 0;
    Py_ssize_t section = 0;
    while ((status = next_batch(in->buf, in->len, &pos, &b, f)) == 1) {
        if (scope->verify_crc && check_batch_crc(in->buf, b.position, b.size_bytes, b.crc, f))
            return -1;
        if (batch_is_skipped(&b, in->skip_control))
            continue;
        Cursor records;
        if (batch_records(in, &b, pos, &section, &records, f))
            return -1;
        if (batch_next_offset(&b) <= scope->from_offset || b.base_offset >= scope->until_offset)
            continue;
        status = walk_batch_records(&b, records, visit, state, f);
        if (status)
            return status;
    }
    if (status == 0 && section != in->section_count)
        return fail(f, FAIL_USAGE, "%lld decompressed sections given, %lld used",
                    (long long)in->section_count, (long long)section);
    return status;
}

/* walk_scoped over every batch, no CRC check. */
static int walk_records(const Input *in, RecordVisitor visit, void *state, Failure *f)
{
    return walk_scoped(in, &WALK_ALL, visit, state, f);
}

static int64_t record_offset(const Batch *b, const Record *r)
{
    return (int64_t)((uint64_t)b->base_offset + (uint64_t)(int64_t)r->offset_delta);
}

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

/* ------------------------------------------------------------------ MurmurHash3 x64 128 */

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

static uint64_t le64(const uint8_t *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, sizeof v); /* one unaligned load */
    return v;
#else
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
#endif
}

/* Austin Appleby's MurmurHash3_x64_128 (public domain), byte order independent. */
static void murmur3_x64_128(const uint8_t *data, size_t len, uint32_t seed, uint64_t out[2])
{
    const uint64_t c1 = 0x87c37b91114253d5ULL, c2 = 0x4cf5ad432745937fULL;
    uint64_t h1 = seed, h2 = seed;
    size_t blocks = len / 16;
    for (size_t i = 0; i < blocks; i++) {
        uint64_t k1 = le64(data + 16 * i), k2 = le64(data + 16 * i + 8);
        h1 ^= rotl64(k1 * c1, 31) * c2;
        h1 = (rotl64(h1, 27) + h2) * 5 + 0x52dce729;
        h2 ^= rotl64(k2 * c2, 33) * c1;
        h2 = (rotl64(h2, 31) + h1) * 5 + 0x38495ab5;
    }
    const uint8_t *tail = data + 16 * blocks;
    uint64_t k1 = 0, k2 = 0;
    size_t rest = len & 15;
    for (size_t i = rest; i > 8; i--)
        k2 = k2 << 8 | tail[i - 1];
    for (size_t i = rest < 8 ? rest : 8; i > 0; i--)
        k1 = k1 << 8 | tail[i - 1];
    if (rest > 8)
        h2 ^= rotl64(k2 * c2, 33) * c1;
    if (rest > 0)
        h1 ^= rotl64(k1 * c1, 31) * c2;
    h1 ^= len;
    h2 ^= len;
    h1 += h2;
    h2 += h1;
    h1 = fmix64(h1);
    h2 = fmix64(h2);
    h1 += h2;
    h2 += h1;
    out[0] = h1;
    out[1] = h2;
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

/* ------------------------------------------------------------------ Python glue */

/* Holds the input buffer and the decompressed sections for the length of one call. */
typedef struct {
    Py_buffer input;
    Py_buffer *sections;
    Py_ssize_t section_count;
} Held;

static void release_held(Held *h)
{
    for (Py_ssize_t i = 0; i < h->section_count; i++)
        PyBuffer_Release(&h->sections[i]);
    PyMem_Free(h->sections);
    if (h->input.obj)
        PyBuffer_Release(&h->input);
}

static int hold(PyObject *buf, PyObject *sections, Held *h)
{
    if (PyObject_GetBuffer(buf, &h->input, PyBUF_SIMPLE))
        return -1;
    if (sections == NULL)
        return 0;
    PyObject *seq = PySequence_Fast(sections, "sections must be a sequence of buffers");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    h->sections = PyMem_Calloc(n ? (size_t)n : 1, sizeof(Py_buffer));
    if (h->sections == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (; h->section_count < n; h->section_count++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, h->section_count);
        if (PyObject_GetBuffer(item, &h->sections[h->section_count], PyBUF_SIMPLE)) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return 0;
}

static Input input_of(const Held *h, int skip_control)
{
    Input in = {h->input.buf, (size_t)h->input.len, h->sections, h->section_count, skip_control};
    return in;
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

static void free_bufs(Buf *bufs, int buf_count)
{
    for (int i = 0; i < buf_count; i++) {
        free(bufs[i].data);
        bufs[i].data = NULL;
    }
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

/* A tuple of OwnedBuffers made from (and emptying) the buffers. */
static PyObject *bufs_to_tuple(Buf *bufs, int buf_count)
{
    PyObject *tuple = PyTuple_New(buf_count);
    for (int i = 0; i < buf_count; i++) {
        PyObject *item = buf_to_owned(&bufs[i]);
        if (tuple == NULL || item == NULL) {
            Py_XDECREF(item);
            free_bufs(bufs + i + 1, buf_count - i - 1);
            Py_XDECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, i, item);
    }
    return tuple;
}

/* A pass's output buffers as a tuple of owned buffers, or, if the pass failed, its error
 * (the buffers freed). */
static PyObject *outputs_or_raise(Buf *outputs, int count, int status, const Failure *failure)
{
    if (status < 0) {
        free_bufs(outputs, count);
        return raise_failure(failure);
    }
    return bufs_to_tuple(outputs, count);
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

/* ------------------------------------------------------------------ produce validation */
/* validate_batches: the storage append path's one call per produce request. Walks the whole
 * v2 batches of a buffer, checks each one's structure and CRC-32C and returns a compact
 * summary per batch; the CRC runs three interleaved hardware streams (the crc32 instruction
 * has a latency of three cycles and a throughput of one), combined with precomputed
 * "shift through N zero bytes" tables, about three times a single stream's speed; on CPUs
 * with AVX-512 VPCLMULQDQ, buffers of 256 bytes or more are folded with carry-less
 * multiplication instead, about twice as fast again. */

#define CRC_LONG_STRIDE_BYTES 4096
#define CRC_SHORT_STRIDE_BYTES 256
#define VALIDATE_GIL_RELEASE_MIN_BYTES (256 * 1024)

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

static void validate_init(void)
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

/* What the append path needs of one batch (returned as a tuple of its fields in order). */
#define BATCH_SUMMARY_FIELDS 8
typedef struct {
    int64_t position, size_bytes, base_timestamp, max_timestamp, producer_id;
    int32_t attributes, last_offset_delta, records_count;
} BatchSummary;

/* Summarise the header of the batch at pos (at least BATCH_HEADER_BYTES), unchecked. */
static void summarize_header(const uint8_t *buf, size_t pos, BatchSummary *s)
{
    const uint8_t *p = buf + pos;
    s->position = (int64_t)pos;
    s->size_bytes = (int64_t)(int32_t)be32(p + 8) + LOG_OVERHEAD_BYTES;
    s->attributes = (int16_t)(p[21] << 8 | p[22]);
    s->last_offset_delta = (int32_t)be32(p + 23);
    s->base_timestamp = (int64_t)be64(p + 27);
    s->max_timestamp = (int64_t)be64(p + 35);
    s->producer_id = (int64_t)be64(p + 43);
    s->records_count = (int32_t)be32(p + 57);
}

/* ---- the produce path's record checks (Kafka's LogValidator) */

static long long saturating_add(long long a, long long b);
static int timestamp_outside(long long timestamp_ms, long long earliest_ms, long long latest_ms);

#define MAX_CODEC_ID 4 /* zstd; ids 5-7 name no codec */
#define NO_TIMESTAMP (-1)

/* What produce validation checks beyond structure and CRC, as Kafka's LogValidator does: a key
 * on every record of a compacted topic; CreateTime record timestamps (other than -1) within
 * [earliest_ms, latest_ms]; for batches from clients, no control batch and a base sequence
 * wherever a producer id is set. */
typedef struct {
    int compacted, check_timestamps, from_client;
    long long earliest_ms, latest_ms;
} RecordChecks;

enum { RECORD_ERROR_NO_KEY = 1, RECORD_ERROR_TIMESTAMP = 2, RECORD_ERROR_TIMESTAMP_TYPE = 3 };

/* One refused record (KIP-467): its index in its batch, why, its timestamp and offset delta. */
typedef struct {
    int64_t timestamp;
    int32_t index, kind, offset_delta;
} RecordError;

/* The refused records of the first batch that has any (Kafka refuses the request there):
 * all are counted, the first RECORD_ERRORS_LISTED_MAX listed, so a batch of tiny refused
 * records costs bounded memory here and in the response (Kafka lists every one). */
#define RECORD_ERRORS_LISTED_MAX 1000
typedef struct {
    Buf errors; /* RecordError */
    int64_t batch_position, total;
} RecordErrors;

static void store_be64(uint8_t *p, uint64_t value)
{
    for (int i = 7; i >= 0; i--, value >>= 8)
        p[i] = (uint8_t)value;
}

static void store_be32(uint8_t *p, uint32_t value)
{
    for (int i = 3; i >= 0; i--, value >>= 8)
        p[i] = (uint8_t)value;
}

/* Kafka's setMaxTimestamp(CREATE_TIME, max) on the batch at p: the header field, the
 * timestamp type bit cleared, and the CRC over them. */
static void set_batch_max_timestamp(uint8_t *p, size_t size_bytes, int64_t max_timestamp)
{
    store_be64(p + 35, (uint64_t)max_timestamp);
    p[22] &= (uint8_t)~ATTR_LOG_APPEND_TIME;
    store_be32(p + 17, ~crc32c_fast_update(~0u, p + CRC_COVERED_FROM,
                                           size_bytes - CRC_COVERED_FROM));
}

/* Kafka's validateBatch: offset range and record count agree, a known codec, and from a
 * client base offset 0 (analyzeAndValidateRecords), no control batch and no producer id
 * without a base sequence. */
static int check_batch_fields(const uint8_t *p, size_t pos, const RecordChecks *c, Failure *f)
{
    long long base_offset = (long long)be64(p);
    int32_t last_offset_delta = (int32_t)be32(p + 23), count = (int32_t)be32(p + 57);
    long long last_offset =
        (long long)((uint64_t)base_offset + (uint64_t)(int64_t)last_offset_delta);
    int codec = p[22] & ATTR_COMPRESSION_MASK;
    if (last_offset_delta < 0)
        return fail(f, FAIL_INVALID_RECORD, "Batch has an invalid offset range: [%lld, %lld]",
                    base_offset, last_offset);
    if (count <= 0)
        return fail(f, FAIL_INVALID_RECORD, "Invalid reported count for record batch: %d",
                    (int)count);
    if (count != last_offset_delta + 1)
        return fail(f, FAIL_INVALID_RECORD,
                    "Inconsistent batch offset range [%lld, %lld] and count of records %d",
                    base_offset, last_offset, (int)count);
    if (codec > MAX_CODEC_ID)
        return fail(f, FAIL_CORRUPT, "record batch at byte %lld has unknown compression type "
                    "id %d", (long long)pos, codec);
    if (!c->from_client)
        return 0;
    if (base_offset != 0)
        return fail(f, FAIL_INVALID_RECORD, "The baseOffset of the record batch should be 0, "
                    "but it is %lld", base_offset);
    if (p[22] & ATTR_CONTROL)
        return fail(f, FAIL_INVALID_RECORD, "Clients are not allowed to write control records");
    long long producer_id = (long long)be64(p + 43);
    int32_t base_sequence = (int32_t)be32(p + 53);
    if (producer_id >= 0 && base_sequence < 0)
        return fail(f, FAIL_INVALID_RECORD, "Invalid sequence number %d in record batch with "
                    "producerId %lld", (int)base_sequence, producer_id);
    return 0;
}

/* The check of one parsed record: 0, or the RECORD_ERROR_* kind Kafka answers for it. A
 * producer may not set LogAppendTime: Kafka refuses it where the timestamp is not checked
 * as a CreateTime (a LogAppendTime topic, or no timestamp). */
static int record_error_kind(const RecordChecks *c, const Record *r, int64_t timestamp,
                             int log_append_time)
{
    if (c->compacted && r->key.len < 0)
        return RECORD_ERROR_NO_KEY;
    if (c->check_timestamps && timestamp != NO_TIMESTAMP)
        return timestamp_outside(timestamp, c->earliest_ms, c->latest_ms)
                   ? RECORD_ERROR_TIMESTAMP : 0;
    return log_append_time ? RECORD_ERROR_TIMESTAMP_TYPE : 0;
}

/* Whether the header of a checked batch needs Kafka's setMaxTimestamp: its max timestamp is
 * not its records' largest, or a producer set the LogAppendTime bit. */
static int needs_max_timestamp_rewrite(const uint8_t *header, int64_t max_timestamp)
{
    return (int64_t)be64(header + 35) != max_timestamp || (header[22] & ATTR_LOG_APPEND_TIME);
}

/* Parse every record of a batch (header at `header`, records in `records`: the bytes after
 * the header, or the decompressed section): each record whole and well formed, offset deltas
 * 0..count-1, no bytes left over; then each record's key and timestamp. *max_timestamp gets
 * the largest record timestamp (-1 if none has one). Per-record refusals collect in `errs`
 * (FAIL_RECORD_ERRORS); a malformed batch is FAIL_INVALID_RECORD. */
static int check_records(Cursor records, const uint8_t *header, size_t pos,
                         const RecordChecks *c, int64_t *max_timestamp, RecordErrors *errs,
                         Failure *f)
{
    uint64_t base_timestamp = be64(header + 27);
    int32_t count = (int32_t)be32(header + 57);
    int log_append_time = (header[22] & ATTR_LOG_APPEND_TIME) != 0;
    int64_t max = NO_TIMESTAMP;
    for (int32_t i = 0; i < count; i++) {
        Record r;
        if (read_record(&records, &r))
            return fail(f, FAIL_INVALID_RECORD, "Found invalid record structure: record %d of "
                        "the batch at byte %lld", (int)i, (long long)pos);
        if (r.offset_delta != i)
            return fail(f, FAIL_INVALID_RECORD, "Record %d of the batch at byte %lld has offset "
                        "delta %d, expected %d", (int)i, (long long)pos, (int)r.offset_delta,
                        (int)i);
        /* as Kafka reads them: a LogAppendTime batch's records all carry its max timestamp */
        int64_t timestamp = log_append_time
                                ? (int64_t)be64(header + 35)
                                : (int64_t)(base_timestamp + (uint64_t)r.timestamp_delta);
        if (timestamp > max)
            max = timestamp;
        int kind = record_error_kind(c, &r, timestamp, log_append_time);
        RecordError error = {timestamp, i, kind, r.offset_delta};
        if (kind && errs->total++ < RECORD_ERRORS_LISTED_MAX &&
            buf_put(&errs->errors, &error, sizeof error))
            return fail_no_memory(f);
    }
    if (records.p != records.end)
        return fail(f, FAIL_INVALID_RECORD, "Incorrect declared batch size, records still "
                    "remaining in file (batch at byte %lld)", (long long)pos);
    if (errs->total) {
        errs->batch_position = (int64_t)pos;
        return fail(f, FAIL_RECORD_ERRORS, "records refused");
    }
    *max_timestamp = max;
    return 0;
}

/* Check the batch at pos (whole, magic 2, plausible length, CRC-32C) and summarise it. With
 * `checks`, also Kafka's batch and record checks; an uncompressed batch's records are walked
 * right after its CRC, while the batch is in the CPU caches, and its max_timestamp in the
 * summary is the largest record timestamp -- written into the header (with a new CRC) when
 * `writable` is the buffer and the header says otherwise, as Kafka's setMaxTimestamp does. */
static int validate_one(uint8_t *writable, const uint8_t *buf, size_t len, size_t pos,
                        const RecordChecks *checks, RecordErrors *errs, BatchSummary *s,
                        Failure *f)
{
    const uint8_t *p = buf + pos;
    if (len - pos < BATCH_HEADER_BYTES)
        return fail(f, FAIL_CORRUPT, "record batch header truncated at byte %lld",
                    (long long)pos);
    int32_t batch_length = (int32_t)be32(p + 8);
    if (p[16] != CURRENT_MAGIC)
        return fail(f, FAIL_CORRUPT, "record batch at byte %lld has magic %d, expected 2",
                    (long long)pos, (int)(int8_t)p[16]);
    if (batch_length < BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES)
        return fail(f, FAIL_CORRUPT, "record batch at byte %lld has length %d", (long long)pos,
                    (int)batch_length);
    size_t size_bytes = (size_t)batch_length + LOG_OVERHEAD_BYTES;
    if (size_bytes > len - pos)
        return fail(f, FAIL_CORRUPT, "record batch at byte %lld overruns the buffer",
                    (long long)pos);
    if (check_batch_crc(buf, pos, size_bytes, be32(p + 17), f))
        return -1;
    summarize_header(buf, pos, s);
    if (checks == NULL)
        return 0;
    if (check_batch_fields(p, pos, checks, f))
        return -1;
    if (s->attributes & ATTR_COMPRESSION_MASK)
        return 0; /* the caller decompresses and calls check_compressed_records */
    Cursor records = {p + BATCH_HEADER_BYTES, p + size_bytes};
    int64_t max_timestamp;
    if (check_records(records, p, pos, checks, &max_timestamp, errs, f))
        return -1;
    if (writable != NULL && needs_max_timestamp_rewrite(p, max_timestamp)) {
        set_batch_max_timestamp(writable + pos, size_bytes, max_timestamp);
        s->attributes &= ~ATTR_LOG_APPEND_TIME;
    }
    s->max_timestamp = max_timestamp;
    return 0;
}

/* Validate every batch of buf into summaries (malloc'd, *count of them). */
static int validate_all(uint8_t *writable, const uint8_t *buf, size_t len,
                        const RecordChecks *checks, RecordErrors *errs, BatchSummary **out,
                        size_t *count, Failure *f)
{
    Buf summaries = {NULL, 0, 0};
    for (size_t pos = 0; pos < len;) {
        BatchSummary s;
        if (validate_one(writable, buf, len, pos, checks, errs, &s, f) < 0) {
            free(summaries.data);
            return -1;
        }
        if (buf_put(&summaries, &s, sizeof s) < 0) {
            free(summaries.data);
            return fail_no_memory(f);
        }
        pos += (size_t)s.size_bytes;
    }
    *out = (BatchSummary *)summaries.data;
    *count = summaries.len / sizeof(BatchSummary);
    return 0;
}

/* Raise RecordsRejected(batch_position, ((index, kind, timestamp, offset_delta), ...), total). */
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

static long long saturating_add(long long a, long long b)
{
    long long sum;
    if (__builtin_add_overflow(a, b, &sum))
        return b > 0 ? LLONG_MAX : LLONG_MIN;
    return sum;
}

static int timestamp_outside(long long timestamp_ms, long long earliest_ms, long long latest_ms)
{
    return timestamp_ms != -1 && (timestamp_ms < earliest_ms || timestamp_ms > latest_ms);
}

/* A topic's per-batch limits at broker time now_ms: max.message.bytes and the window
 * message.timestamp.before/after.max.ms leave for CreateTime timestamps. */
typedef struct {
    long long max_message_bytes, earliest_ms, latest_ms;
} BatchLimits;

static BatchLimits batch_limits(long long max_message_bytes, long long now_ms,
                                long long before_max_ms, long long after_max_ms)
{
    BatchLimits l = {max_message_bytes,
                     saturating_add(now_ms, before_max_ms == LLONG_MIN ? LLONG_MAX
                                                                       : -before_max_ms),
                     saturating_add(now_ms, after_max_ms)};
    return l;
}

/* Whether a batch breaks the limits: too large, a record count that is not
 * last_offset_delta + 1 (or none), or (when checked) a timestamp outside the window. */
static int outside_limits(const BatchLimits *l, long long size_bytes,
                          long long last_offset_delta, long long records_count,
                          long long base_timestamp, long long max_timestamp,
                          int check_timestamps)
{
    if (size_bytes > l->max_message_bytes || records_count < 1 ||
        records_count != last_offset_delta + 1)
        return 1;
    return check_timestamps && (timestamp_outside(base_timestamp, l->earliest_ms, l->latest_ms) ||
                                timestamp_outside(max_timestamp, l->earliest_ms, l->latest_ms));
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

/* append_plain_batch: the storage append path's common case in one call. A produce request
 * that is exactly one v2 batch needing nothing but validation and an offset -- in the
 * topic's codec (or a control batch), fitting the active segment -- is checked exactly as
 * validate_batches and first_batch_outside_limits check it (structure and CRC-32C raise
 * CorruptMessage with the same message) and written to fd with its base offset replaced, all
 * with the GIL released: (last_offset, max_timestamp, True). The caller's buffer is only read
 * (it may be bytes or a read-only memoryview of a request frame): the new 8-byte base offset
 * and the rest of the batch go out in one writev -- the CRC does not cover the base offset.
 * A batch carrying a producer id (not a control batch) is validated alike but not written:
 * (last_offset, max_timestamp, False) -- the caller checks its sequence and then calls
 * write_batch. Anything else -- an empty request, several batches, a limit exceeded, another
 * codec, no room left in the segment, an object that is not a contiguous buffer -- is
 * declined: None, nothing written, and the caller's general path validates again and decides
 * (raising the precise error); the header alone decides that, so a declined request costs no
 * CRC here. Writes continue after short writes; EINTR runs the signal handlers and retries; a
 * failed write truncates the file back to where the batch began and raises OSError. */

typedef struct {
    int64_t base_offset, max_size_bytes, max_last_offset, required_codec;
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

/* A batch to write with its base offset replaced: `base_offset` (big-endian), then
 * buf[BASE_OFFSET_BYTES..len); the caller's buffer itself is never changed. */
enum { BASE_OFFSET_BYTES = 8 };
typedef struct {
    const uint8_t *buf;
    size_t len;
    uint8_t base_offset[BASE_OFFSET_BYTES];
} PatchedBatch;

/* Write bytes [*written..len) of the patched batch to fd: one writev for the new base offset
 * and the rest while the base offset is not out, then plain writes; 0 when done, else errno
 * (EINTR: call again after signals). */
static int write_patched(int fd, const PatchedBatch *b, size_t *written)
{
    while (*written < b->len) {
        ssize_t count;
        if (*written < BASE_OFFSET_BYTES) {
            struct iovec parts[2] = {
                {(void *)(b->base_offset + *written), BASE_OFFSET_BYTES - *written},
                {(void *)(b->buf + BASE_OFFSET_BYTES), b->len - BASE_OFFSET_BYTES},
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
    if (nargs != 7 || !PyTuple_Check(args[6]) || PyTuple_GET_SIZE(args[6]) != 6) {
        PyErr_SetString(PyExc_TypeError, "append_plain_batch(buf, fd, base_offset, "
                        "max_size_bytes, max_last_offset, now_ms, (max_message_bytes, "
                        "before_max_ms, after_max_ms, required_codec, compacted, "
                        "from_client))");
        return -1;
    }
    long long limits[6];
    for (Py_ssize_t i = 0; i < 6; i++)
        limits[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(args[6], i));
    l->base_offset = PyLong_AsLongLong(args[2]);
    l->max_size_bytes = PyLong_AsLongLong(args[3]);
    l->max_last_offset = PyLong_AsLongLong(args[4]);
    long long now_ms = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred() || fd_argument(args[1], fd) < 0)
        return -1;
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
    put_be64(batch.base_offset, limits.base_offset);
    Py_BEGIN_ALLOW_THREADS
    outcome = plain_validate(batch.buf, batch.len, &limits, &s, &failure);
    if (outcome == PLAIN_WRITE)
        error = write_patched(fd, &batch, &written);
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

/* write_batch(buf, fd, base_offset): write the batch buf (validated by append_plain_batch,
 * sequence checked by the caller) to fd with its base offset replaced, GIL released, buf
 * only read; the same writev, EINTR and failure handling. */
static PyObject *py_write_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    int fd;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "write_batch(buf, fd, base_offset)");
        return NULL;
    }
    long long base_offset = PyLong_AsLongLong(args[2]);
    if ((base_offset == -1 && PyErr_Occurred()) || fd_argument(args[1], &fd) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.len < LOG_OVERHEAD_BYTES) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "write_batch: buffer shorter than a batch header");
        return NULL;
    }
    PatchedBatch batch = {view.buf, (size_t)view.len, {0}};
    size_t written = 0;
    int error;
    put_be64(batch.base_offset, base_offset);
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
} PassScope;

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
    if (r->key.len < 0 || !pass_is_dirty(&m->scope, record_offset(b, r)))
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
        KeptRecord k = {start, NULL, records.p,
                        (int64_t)((uint64_t)b->base_timestamp + (uint64_t)r.timestamp_delta), 0};
        k.tail = record_tail(start, records.p, &k.attributes);
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

static void put_be16_at(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8); p[1] = (uint8_t)v; }

static void put_be32_at(uint8_t *p, uint32_t v)
{
    for (int i = 3; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static void put_be64_at(uint8_t *p, uint64_t v)
{
    put_be32_at(p, (uint32_t)(v >> 32));
    put_be32_at(p + 4, (uint32_t)v);
}

static int put_uvarint(Buf *b, uint64_t v)
{
    uint8_t bytes[10];
    int n = 0;
    for (; v >= 0x80; v >>= 7)
        bytes[n++] = (uint8_t)(v | 0x80);
    bytes[n++] = (uint8_t)v;
    return buf_put(b, bytes, (size_t)n);
}

static size_t uvarint_bytes(uint64_t v)
{
    size_t n = 1;
    for (; v >= 0x80; v >>= 7)
        n++;
    return n;
}

static uint64_t zigzag64(int64_t v) { return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63); }

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
    if (t.kept == t.total && (t.tombstones_kept == 0 || has_horizon))
        return buf_put(&bf->out, raw, b->size_bytes) ? fail_no_memory(f) : 0;
    if (t.kept > 0)
        return rebuild_batch(bf, raw, b, &t, f);
    int64_t producer_id = (int64_t)be64(raw + PRODUCER_ID_AT);
    if (producer_id >= 0 && is_protected(bf, batch_next_offset(b) - 1)) {
        /* the producer's last batch stays, empty, so its state survives */
        NewHeader h = {(int16_t)(b->attributes & ~ATTR_COMPRESSION_MASK), b->base_timestamp,
                       b->max_timestamp, 0};
        return write_batch(&bf->out, raw, &h, NULL, 0, 1, f);
    }
    return 0;
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
            if (buf_put(&bf->out, raw, b.size_bytes))
                return fail_no_memory(f);
            continue;
        }
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
    Py_buffer fps, words, protected_last_offsets;
} CleanerArgs;

static void release_cleaner_args(CleanerArgs *a)
{
    Py_buffer *all[] = {&a->fps, &a->words, &a->protected_last_offsets};
    for (int i = 0; i < 3; i++)
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
    PyObject *buf, *sections, *fps, *words;
    long long room, first, end, ordinal;
    unsigned long long low, high;
    CleanerArgs held;
    MapBuild build;
    Failure failure = {FAIL_NONE, ""};
    memset(&held, 0, sizeof held);
    memset(&build, 0, sizeof build);
    if (!PyArg_ParseTuple(args, "OOOOLLLKKL", &buf, &sections, &fps, &words, &room, &first, &end,
                          &low, &high, &ordinal))
        return NULL;
    build.scope = (PassScope){NULL, NULL, 0, first, end, low, high, ordinal};
    build.room = room;
    if (hold_cleaner_args(&held, buf, sections, fps, words, &build.scope)) {
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
    PyObject *buf, *sections, *fps, *words, *protected_offsets;
    long long first, end, ordinal, now_ms, horizon_ms;
    unsigned long long low, high;
    CleanerArgs held;
    BatchFilter bf;
    Failure failure = {FAIL_NONE, ""};
    memset(&held, 0, sizeof held);
    memset(&bf, 0, sizeof bf);
    if (!PyArg_ParseTuple(args, "OOOOLLKKLLLO", &buf, &sections, &fps, &words, &first, &end, &low,
                          &high, &ordinal, &now_ms, &horizon_ms, &protected_offsets))
        return NULL;
    bf.scope = (PassScope){NULL, NULL, 0, first, end, low, high, ordinal};
    bf.now_ms = now_ms;
    bf.new_horizon_ms = horizon_ms;
    if (hold_cleaner_args(&held, buf, sections, fps, words, &bf.scope) ||
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
 * the event loop stores the time of each request it receives (note_broker_request), and a
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

static int64_t clock_ns(clockid_t clock)
{
    struct timespec now;
    clock_gettime(clock, &now);
    return (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
}

static int64_t monotonic_ns(void)
{
    return clock_ns(CLOCK_MONOTONIC);
}

static PyObject *py_note_broker_request(PyObject *self, PyObject *unused)
{
    __atomic_store_n(&broker_request_ns, monotonic_ns(), __ATOMIC_RELAXED);
    Py_RETURN_NONE;
}

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
    PyObject *buffer, *fps, *words;
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
    if (!PyArg_ParseTuple(args, "iOLLLOOLLLKKLii", &span.fd, &buffer, &span.position,
                          &span.end_position, &span.span_bytes, &fps, &words, &room, &first,
                          &end, &low, &high, &ordinal, &niceness, &span.direct_fd))
        return NULL;
    build.scope = (PassScope){NULL, NULL, 0, first, end, low, high, ordinal};
    build.room = room;
    if (hold_span_args(&held, buffer, &span, &build.scope, fps, words)) {
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
    PyObject *buffer, *fps, *words, *protected_offsets, *stage;
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
    if (!PyArg_ParseTuple(args, "iiOLLLOOLLKKLLLOLLL(LLLLp)Onii", &span.fd, &sf.out_fd,
                          &buffer, &span.position, &span.end_position, &span.span_bytes, &fps,
                          &words, &first, &end, &low, &high, &ordinal, &now_ms, &horizon_ms,
                          &protected_offsets, &sf.index_in.buffer_position,
                          &sf.index.next_offset, &sf.index_in.interval_bytes,
                          &st->bytes_since_last_entry, &st->max_timestamp,
                          &st->offset_of_max_timestamp, &st->last_time_entry,
                          &st->has_time_entry, &stage, &stage_fill, &niceness,
                          &span.direct_fd))
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
    sf.bf.scope = (PassScope){NULL, NULL, 0, first, end, low, high, ordinal};
    sf.bf.now_ms = now_ms;
    sf.bf.new_horizon_ms = horizon_ms;
    if (hold_span_args(&held, buffer, &span, &sf.bf.scope, fps, words) ||
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
    j.attributes = (int16_t)(attributes & ATTR_COMPRESSION_MASK);
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
     "range_high, first_ordinal, now_ms, new_horizon_ms, protected_last_offsets) -> ((out, "
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
     "index_state, stage, stage_fill, niceness, direct_fd) -> (position, stop, stop_bytes, "
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
    {"note_broker_request", py_note_broker_request, METH_NOARGS,
     "note_broker_request() -> None: the broker received a request now; niced cleaner spans "
     "pause briefly between chunks while requests keep coming (cooperative spans)."},
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
    {"index_batches", py_index_batches, METH_VARARGS,
     "index_batches(buf, buffer_position, file_size, min_base_offset, next_offset, "
     "interval_bytes, (bytes_since_last_entry, max_timestamp, offset_of_max_timestamp, "
     "last_time_entry, has_time_entry)) -> (bytes_valid, next_offset, stopped, has_first, "
     "first_max_timestamp, state, (offset_entries, time_entries, positions)): segment "
     "recovery's CRC scan and index rebuild over one chunk."},
    {"crc32c", py_crc32c_interleaved, METH_O,
     "crc32c(buf) -> CRC-32C of buf (three interleaved hardware streams where available)."},
    {"first_batch_outside_limits", (PyCFunction)(void (*)(void))py_first_batch_outside_limits,
     METH_FASTCALL,
     "first_batch_outside_limits(summaries, max_message_bytes, now_ms, before_max_ms, "
     "after_max_ms, check_timestamps) -> index of the first batch failing the produce "
     "limits, or -1."},
    {"append_plain_batch", (PyCFunction)(void (*)(void))py_append_plain_batch, METH_FASTCALL,
     "append_plain_batch(buf, fd, base_offset, max_size_bytes, max_last_offset, now_ms, "
     "(max_message_bytes, before_max_ms, after_max_ms, required_codec, compacted, "
     "from_client)) -> (last_offset, max_timestamp, written) after validating (and, without "
     "a producer id, compressed records or a max timestamp to rewrite, offsetting and "
     "writing) one batch, or None (declined, nothing written)."},
    {"write_batch", (PyCFunction)(void (*)(void))py_write_batch, METH_FASTCALL,
     "write_batch(buf, fd, base_offset): rewrite the base offset and write the batch to fd."},
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

static struct PyModuleDef kernel_module = {
    PyModuleDef_HEAD_INIT, "headrace.protocol._kernel",
    "Compiled record kernel; use headrace.protocol.kernel.", -1, kernel_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernel(void)
{
    crc32c_init_table();
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2"))
        crc32c_update = crc32c_sse42;
#endif
    validate_init();
    page_cache_probe_init();
    if (PyType_Ready(&OwnedBufferType) < 0)
        return NULL;
    PyObject *errors = PyImport_ImportModule("headrace.errors");
    if (errors == NULL)
        return NULL;
    corrupt_message_error = PyObject_GetAttrString(errors, "CorruptMessage");
    invalid_record_error = PyObject_GetAttrString(errors, "InvalidRecord");
    Py_DECREF(errors);
    if (corrupt_message_error == NULL || invalid_record_error == NULL)
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
    if (module != NULL &&
        (PyModule_AddStringConstant(module, "CRC32C_VARIANT", crc32c_variant) < 0 ||
         PyModule_AddStringConstant(module, "CRC32C_VARIANTS_SUPPORTED",
                                    crc32c_variants_supported) < 0 ||
         PyModule_AddIntConstant(module, "HELD_VIEWS_MAX", HELD_VIEWS_MAX) < 0)) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
