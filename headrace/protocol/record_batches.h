/*
 * record_batches.h -- Kafka v2 record batches in C, for every compiled module that reads them:
 * static functions compiled into each includer.
 *
 * Owns walking batch headers (next_batch, scan_batches: CRC-32C checked), parsing records
 * (bounds-checked zigzag varints) and visiting them (walk_records, walk_scoped, over the
 * caller's buffer and the decompressed sections of its compressed batches, held by hold()),
 * MurmurHash3 x64 128 of keys, and produce validation as Kafka's LogValidator does it
 * (validate_one: structure, CRC, every record parsed in the CRC pass, per-record errors, the
 * max timestamp from the records; outside_limits: max.message.bytes and the timestamp window).
 *
 * Batch layout (big-endian): base_offset int64 @0, batch_length int32 @8, leader epoch
 * @12, magic int8 @16, crc uint32 @17 (CRC-32C of bytes 21..end), attributes int16 @21,
 * last_offset_delta int32 @23, base_timestamp int64 @27, max_timestamp int64 @35,
 * producer id/epoch/base sequence @43..56, records_count int32 @57, records @61.
 * Record: length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
 * key (varint length, -1 = null), value (same), headersCount varint, headers
 * [key length varint >= 0, key, value length varint (-1 = null), value].
 *
 * Layer: protocol (includes kernel_common.h and crc32c.h). Storage's C includes it for the
 * append path and the cleaner's passes.
 *
 * Thread-safety: no state of its own; every function runs without the GIL except hold() and
 * release_held().
 */
#ifndef HEADRACE_PROTOCOL_RECORD_BATCHES_H
#define HEADRACE_PROTOCOL_RECORD_BATCHES_H

/* Not every includer uses every function here. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#include "kernel_common.h"
#include "crc32c.h"

/* ------------------------------------------------------------------ batches */

typedef struct {
    int64_t base_offset, base_timestamp, max_timestamp, producer_id;
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
    b->producer_id = (int64_t)be64(p + 43);
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

/* ------------------------------------------------------------------ holding a call's buffers */

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

/* ---- produce limits (max.message.bytes, the CreateTime timestamp window) */

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

/* ---- the produce path's record checks (Kafka's LogValidator) */

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

/* Kafka's record checks of one batch as a walk that can pause: its records may arrive a piece
 * at a time (a compressed section as it is inflated). Each record is checked whole and well
 * formed, with offset delta = its index, then its key and timestamp; max is the largest
 * record timestamp so far (-1 while none has one). */
typedef struct {
    const uint8_t *header, *next; /* the batch header; the next record to check */
    const RecordChecks *checks;
    size_t pos; /* the batch's byte position, for messages */
    uint64_t base_timestamp;
    int64_t max;
    int32_t count, index;
    int log_append_time;
} RecordsWalk;

static void records_walk_start(RecordsWalk *w, const uint8_t *records, const uint8_t *header,
                               size_t pos, const RecordChecks *c)
{
    *w = (RecordsWalk){header, records, c, pos, be64(header + 27), NO_TIMESTAMP,
                       (int32_t)be32(header + 57), 0, (header[22] & ATTR_LOG_APPEND_TIME) != 0};
}

/* Whether the record at p is wholly before end: its length varint complete and in range.
 * Otherwise it is either cut by end or malformed; only the walk to the true end tells. */
static int record_is_whole(const uint8_t *p, const uint8_t *end)
{
    Cursor c = {p, end};
    int32_t length;
    return read_varint(&c, &length) == 0 && length >= 0 && length <= c.end - c.p;
}

/* Check the records from w->next up to end. With more_to_come, stop at the first record not
 * wholly before end (more bytes follow it later); without, end is the records' true end:
 * every record is checked, and then nothing may be left over. Per-record refusals collect in
 * `errs` (FAIL_RECORD_ERRORS once the walk is complete); a malformed batch is
 * FAIL_INVALID_RECORD. Checking the records in pieces finds exactly what one walk over all of
 * them finds: a whole record parses the same whatever follows it. */
static int records_walk_advance(RecordsWalk *w, const uint8_t *end, int more_to_come,
                                RecordErrors *errs, Failure *f)
{
    const RecordChecks *c = w->checks;
    Cursor records = {w->next, end};
    for (; w->index < w->count; w->index++) {
        int32_t i = w->index;
        if (more_to_come && !record_is_whole(records.p, end))
            break;
        Record r;
        if (read_record(&records, &r))
            return fail(f, FAIL_INVALID_RECORD, "Found invalid record structure: record %d of "
                        "the batch at byte %lld", (int)i, (long long)w->pos);
        if (r.offset_delta != i)
            return fail(f, FAIL_INVALID_RECORD, "Record %d of the batch at byte %lld has offset "
                        "delta %d, expected %d", (int)i, (long long)w->pos, (int)r.offset_delta,
                        (int)i);
        /* as Kafka reads them: a LogAppendTime batch's records all carry its max timestamp */
        int64_t timestamp = w->log_append_time
                                ? (int64_t)be64(w->header + 35)
                                : (int64_t)(w->base_timestamp + (uint64_t)r.timestamp_delta);
        if (timestamp > w->max)
            w->max = timestamp;
        int kind = record_error_kind(c, &r, timestamp, w->log_append_time);
        RecordError error = {timestamp, i, kind, r.offset_delta};
        if (kind && errs->total++ < RECORD_ERRORS_LISTED_MAX &&
            buf_put(&errs->errors, &error, sizeof error))
            return fail_no_memory(f);
        w->next = records.p;
    }
    if (more_to_come)
        return 0;
    if (records.p != records.end)
        return fail(f, FAIL_INVALID_RECORD, "Incorrect declared batch size, records still "
                    "remaining in file (batch at byte %lld)", (long long)w->pos);
    if (errs->total) {
        errs->batch_position = (int64_t)w->pos;
        return fail(f, FAIL_RECORD_ERRORS, "records refused");
    }
    return 0;
}

/* Parse every record of a batch (header at `header`, records in `records`: the bytes after
 * the header, or the decompressed section) in one walk: records_walk_advance to the end.
 * *max_timestamp gets the largest record timestamp (-1 if none has one). */
static int check_records(Cursor records, const uint8_t *header, size_t pos,
                         const RecordChecks *c, int64_t *max_timestamp, RecordErrors *errs,
                         Failure *f)
{
    RecordsWalk walk;
    records_walk_start(&walk, records.p, header, pos, c);
    if (records_walk_advance(&walk, records.end, 0, errs, f))
        return -1;
    *max_timestamp = walk.max;
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
    int64_t max_timestamp = NO_TIMESTAMP; /* set by check_records when it returns 0 */
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

#pragma GCC diagnostic pop

#endif /* HEADRACE_PROTOCOL_RECORD_BATCHES_H */
