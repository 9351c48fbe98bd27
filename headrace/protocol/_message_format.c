/*
 * headrace.protocol._message_format -- magic 0/1 message sets <-> v2 records, compiled.
 *
 * Owns the per-message loops of Kafka's message-format conversion for the oldest Produce
 * (v0-2) and Fetch (v0-3) versions: up-conversion of a legacy message set into the records
 * section of one v2 batch (checking every message's CRC-32), and down-conversion of v2
 * batches into legacy messages (computing every message's CRC-32). The Python face is
 * headrace/protocol/message_format.py: it decompresses and compresses (one call per
 * compressed wrapper or batch) and seals the v2 batch header.
 *
 * Legacy message (big-endian): offset int64, message_size int32 (bytes after itself),
 * crc uint32 (CRC-32, IEEE, of magic..end), magic int8 (0 or 1), attributes int8 (bits 0-2
 * codec, bit 3 LogAppendTime in magic 1), timestamp int64 (magic 1 only), key int32 length
 * + bytes (-1 = null), value int32 length + bytes (-1 = null).
 * v2 batch: base_offset int64 @0, batch_length int32 @8, magic int8 @16, attributes int16
 * @21 (bits 0-2 codec, bit 3 LogAppendTime, bit 5 control), base_timestamp int64 @27,
 * max_timestamp int64 @35, records_count int32 @57, records @61. v2 record: length varint,
 * attributes int8, timestamp delta varlong, offset delta varint, key and value (varint
 * length, -1 = null), header count varint, headers (varint-length key and value).
 *
 * Thread-safety: no mutable state after module init (the CRC-32 table is filled there).
 * The loops run with the GIL released over buffers the caller holds for the call. Malformed
 * input is reported as headrace.errors.CorruptMessage (or InvalidRecord where Kafka's
 * LogValidator says so), never read past.
 */
#define KERNEL_MODULE_NAME "headrace.protocol._message_format"
#include "kernel_common.h" /* Failure, big-endian loads and stores; LOG_OVERHEAD_BYTES, ... */

#define LEGACY_V0_OVERHEAD_BYTES 14 /* crc, magic, attributes, key and value lengths */
#define LEGACY_V1_OVERHEAD_BYTES 22 /* the same and a timestamp */
#define LEGACY_TIMESTAMP_TYPE_BIT 0x08
#define BATCH_MAGIC_AT 16
#define BATCH_ATTRIBUTES_AT 21
#define BATCH_BASE_TIMESTAMP_AT 27
#define BATCH_MAX_TIMESTAMP_AT 35
#define BATCH_RECORDS_COUNT_AT 57
#define CODEC_MASK 0x07
#define TIMESTAMP_TYPE_BIT 0x08
#define CONTROL_BIT 0x20
#define VARINT_MAX_BYTES 5
#define VARLONG_MAX_BYTES 10
#define OUTPUT_INITIAL_BYTES 4096

/* ------------------------------------------------------------------ growable output */

typedef struct {
    uint8_t *data;
    size_t length, capacity;
} Output;

static int reserve(Output *out, size_t extra, Failure *f)
{
    if (out->length + extra <= out->capacity)
        return 0;
    size_t capacity = out->capacity ? out->capacity : OUTPUT_INITIAL_BYTES;
    while (capacity < out->length + extra)
        capacity *= 2;
    uint8_t *data = realloc(out->data, capacity);
    if (!data)
        return fail(f, FAIL_NO_MEMORY, "out of memory");
    out->data = data;
    out->capacity = capacity;
    return 0;
}

/* The output as a bytes object (GIL held); frees the buffer. */
static PyObject *output_to_bytes(Output *out)
{
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)out->data, (Py_ssize_t)out->length);
    free(out->data);
    out->data = NULL;
    return bytes;
}

/* ------------------------------------------------------------------ CRC-32 */

/* CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320, zlib's), sliced by 8 bytes. */
static uint32_t crc32_tables[8][256];

static void crc32_init_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t crc = i;
        for (int bit = 0; bit < 8; bit++)
            crc = crc & 1 ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
        crc32_tables[0][i] = crc;
    }
    for (int slice = 1; slice < 8; slice++)
        for (int i = 0; i < 256; i++) {
            uint32_t previous = crc32_tables[slice - 1][i];
            crc32_tables[slice][i] = (previous >> 8) ^ crc32_tables[0][previous & 0xff];
        }
}

static uint32_t crc32_ieee(const uint8_t *p, size_t n)
{
    uint32_t crc = 0xFFFFFFFFu;
    while (n >= 8) {
        uint32_t low = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                              (uint32_t)p[3] << 24);
        crc = crc32_tables[7][low & 0xff] ^ crc32_tables[6][(low >> 8) & 0xff] ^
              crc32_tables[5][(low >> 16) & 0xff] ^ crc32_tables[4][low >> 24] ^
              crc32_tables[3][p[4]] ^ crc32_tables[2][p[5]] ^ crc32_tables[1][p[6]] ^
              crc32_tables[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = crc32_tables[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* ------------------------------------------------------------------ varints */

static void put_varint(Output *out, int64_t value)
{
    uint64_t encoded = ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
    while (encoded >= 0x80) {
        out->data[out->length++] = (uint8_t)(encoded | 0x80);
        encoded >>= 7;
    }
    out->data[out->length++] = (uint8_t)encoded;
}

/* A zigzag varint of at most max_bytes at *p (< end); -1 when truncated or too long. */
static int read_signed_varint(const uint8_t **p, const uint8_t *end, int max_bytes, int64_t *value)
{
    uint64_t result = 0;
    for (int i = 0; i < max_bytes && *p < end; i++) {
        uint8_t byte = *(*p)++;
        result |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (!(byte & 0x80)) {
            *value = (int64_t)(result >> 1) ^ -(int64_t)(result & 1);
            return 0;
        }
    }
    return -1;
}

/* ------------------------------------------------------------------ up-conversion */

/* What the records written so far share: the next offset delta and the timestamps. */
typedef struct {
    int64_t next_delta;
    int has_base_timestamp;
    int64_t base_timestamp, max_timestamp;
} UpState;

/* A compressed message met in an outer message set: Python decompresses its value. */
typedef struct {
    int64_t offset, timestamp;
    int magic, attributes;
    size_t value_at, value_length;
} Wrapper;

/* The key or value of a legacy message at *p: length int32 (-1 = null), then bytes. */
static int legacy_bytes(const uint8_t **p, const uint8_t *end, int32_t *length)
{
    if (end - *p < 4)
        return -1;
    *length = (int32_t)be32(*p);
    *p += 4;
    if (*length == -1)
        return 0;
    if (*length < 0 || end - *p < *length)
        return -1;
    *p += *length;
    return 0;
}

static int append_v2_record(Output *out, UpState *state, int64_t timestamp,
                            const uint8_t *key, int32_t key_length,
                            const uint8_t *value, int32_t value_length, Failure *f)
{
    size_t payload = (size_t)(key_length > 0 ? key_length : 0) + (value_length > 0 ? value_length : 0);
    if (reserve(out, payload + 1 + VARLONG_MAX_BYTES + 4 * VARINT_MAX_BYTES + 1, f))
        return -1;
    if (!state->has_base_timestamp) {
        state->has_base_timestamp = 1;
        state->base_timestamp = timestamp;
    }
    if (timestamp > state->max_timestamp)
        state->max_timestamp = timestamp;
    uint8_t body[1 + VARLONG_MAX_BYTES + 2 * VARINT_MAX_BYTES];
    Output head = {body, 0, sizeof body};
    body[head.length++] = 0; /* attributes */
    put_varint(&head, (int64_t)((uint64_t)timestamp - (uint64_t)state->base_timestamp));
    put_varint(&head, state->next_delta++);
    put_varint(&head, key_length);
    uint8_t value_varint[VARINT_MAX_BYTES];
    Output value_head = {value_varint, 0, sizeof value_varint};
    put_varint(&value_head, value_length);
    size_t length = head.length + (key_length > 0 ? (size_t)key_length : 0) + value_head.length +
                    (value_length > 0 ? (size_t)value_length : 0) + 1; /* + header count */
    put_varint(out, (int64_t)length);
    memcpy(out->data + out->length, body, head.length);
    out->length += head.length;
    if (key_length > 0) {
        memcpy(out->data + out->length, key, (size_t)key_length);
        out->length += (size_t)key_length;
    }
    memcpy(out->data + out->length, value_varint, value_head.length);
    out->length += value_head.length;
    if (value_length > 0) {
        memcpy(out->data + out->length, value, (size_t)value_length);
        out->length += (size_t)value_length;
    }
    out->data[out->length++] = 0; /* no headers */
    return 0;
}

/*
 * Convert the legacy messages of buf[*pos..length) into v2 records appended to out.
 * inner_magic < 0: an outer set; a compressed message stops the walk and is returned in
 * *wrapper (*found = 1) with *pos after it. inner_magic >= 0: a piece of the decompressed
 * set of a wrapper of that magic, which may end inside a message (the walk stops there, *pos
 * at its start, for the caller to append the next inflated chunk): every message must have
 * that magic and be uncompressed; with force_timestamp, forced_timestamp replaces each one's
 * (a magic 1 wrapper with LogAppendTime).
 */
static int legacy_to_records(const uint8_t *buf, size_t length, size_t *pos, int inner_magic,
                             int force_timestamp, int64_t forced_timestamp, UpState *state, Output *out,
                             Wrapper *wrapper, int *found, Failure *f)
{
    *found = 0;
    while (*pos < length) {
        size_t at = *pos;
        if (length - at < LOG_OVERHEAD_BYTES) {
            if (inner_magic >= 0)
                return 0; /* the rest of an inflating wrapper comes in the next chunk */
            return fail(f, FAIL_CORRUPT, "legacy message at byte %zu is truncated", at);
        }
        int64_t offset = (int64_t)be64(buf + at);
        int32_t size = (int32_t)be32(buf + at + 8);
        if (size < LEGACY_V0_OVERHEAD_BYTES)
            return fail(f, FAIL_CORRUPT, "legacy message at offset %lld has size %d, below the "
                        "minimum of %d", (long long)offset, size, LEGACY_V0_OVERHEAD_BYTES);
        if ((size_t)size > length - at - LOG_OVERHEAD_BYTES) {
            if (inner_magic >= 0)
                return 0;
            return fail(f, FAIL_CORRUPT, "legacy message at offset %lld overruns its set",
                        (long long)offset);
        }
        const uint8_t *message = buf + at + LOG_OVERHEAD_BYTES, *end = message + size;
        int magic = message[4], attributes = message[5];
        if (magic > 1)
            return fail(f, FAIL_CORRUPT, "message at offset %lld has magic %d among magic 0/1 "
                        "messages", (long long)offset, magic);
        if (magic == 1 && size < LEGACY_V1_OVERHEAD_BYTES)
            return fail(f, FAIL_CORRUPT, "magic 1 message at offset %lld is truncated",
                        (long long)offset);
        if (crc32_ieee(message + 4, (size_t)size - 4) != be32(message))
            return fail(f, FAIL_CORRUPT, "message at offset %lld fails its CRC-32 check",
                        (long long)offset);
        int64_t timestamp = magic == 1 ? (int64_t)be64(message + 6) : NO_TIMESTAMP;
        const uint8_t *p = message + (magic == 1 ? 14 : 6), *key = p + 4, *value;
        int32_t key_length, value_length;
        if (legacy_bytes(&p, end, &key_length))
            return fail(f, FAIL_CORRUPT, "key of message at offset %lld overruns it", (long long)offset);
        value = p + 4;
        if (legacy_bytes(&p, end, &value_length) || p != end)
            return fail(f, FAIL_CORRUPT, "value of message at offset %lld does not fill it",
                        (long long)offset);
        *pos = at + LOG_OVERHEAD_BYTES + (size_t)size;
        int codec = attributes & CODEC_MASK;
        if (inner_magic >= 0) {
            if (magic != inner_magic)
                return fail(f, FAIL_INVALID_RECORD, "inner message magic %d does not match its "
                            "wrapper's %d", magic, inner_magic);
            if (codec)
                return fail(f, FAIL_INVALID_RECORD, "compressed outer message holds an inner "
                            "message with a compression attribute set");
            if (force_timestamp)
                timestamp = forced_timestamp;
        } else if (codec) {
            if (value_length < 0)
                return fail(f, FAIL_CORRUPT, "compressed message at offset %lld has a null "
                            "value", (long long)offset);
            *wrapper = (Wrapper){offset, timestamp, magic, attributes,
                                 (size_t)(value - buf), (size_t)value_length};
            *found = 1;
            return 0;
        }
        if (append_v2_record(out, state, timestamp, key, key_length, value, value_length, f))
            return -1;
    }
    return 0;
}

/*
 * legacy_to_records(buf, position, next_delta, base_timestamp, max_timestamp, inner_magic,
 *                   force_timestamp, forced_timestamp)
 *   -> (records: bytes, position, next_delta, base_timestamp, max_timestamp, wrapper)
 * base_timestamp None: no record written yet. wrapper: None, or (offset, magic, attributes,
 * timestamp, value_position, value_length) of the compressed message the walk stopped after.
 */
static PyObject *py_legacy_to_records(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t position;
    long long next_delta, max_timestamp, forced_timestamp;
    PyObject *base_timestamp;
    int inner_magic, force_timestamp;
    if (!PyArg_ParseTuple(args, "y*nLOLipL", &view, &position, &next_delta, &base_timestamp,
                          &max_timestamp, &inner_magic, &force_timestamp, &forced_timestamp))
        return NULL;
    UpState state = {next_delta, base_timestamp != Py_None, 0, max_timestamp};
    if (state.has_base_timestamp) {
        state.base_timestamp = PyLong_AsLongLong(base_timestamp);
        if (state.base_timestamp == -1 && PyErr_Occurred()) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    if (position < 0 || position > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "position outside the buffer");
        return NULL;
    }
    size_t pos = (size_t)position;
    Output out = {0};
    Wrapper wrapper;
    Failure failure = {FAIL_NONE, ""};
    int found = 0, status;
    Py_BEGIN_ALLOW_THREADS
    status = legacy_to_records(view.buf, (size_t)view.len, &pos, inner_magic, force_timestamp,
                               forced_timestamp,
                               &state, &out, &wrapper, &found, &failure);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (status) {
        free(out.data);
        return raise_failure(&failure);
    }
    PyObject *records = output_to_bytes(&out);
    if (!records)
        return NULL;
    PyObject *base = state.has_base_timestamp ? PyLong_FromLongLong(state.base_timestamp)
                                              : Py_NewRef(Py_None);
    PyObject *stopped_at = found ? Py_BuildValue("(LiiLnn)", (long long)wrapper.offset,
                                                 wrapper.magic, wrapper.attributes,
                                                 (long long)wrapper.timestamp,
                                                 (Py_ssize_t)wrapper.value_at,
                                                 (Py_ssize_t)wrapper.value_length)
                                 : Py_NewRef(Py_None);
    PyObject *result = NULL;
    if (base && stopped_at)
        result = Py_BuildValue("(NnLOLO)", records, (Py_ssize_t)pos, (long long)state.next_delta,
                               base, (long long)state.max_timestamp, stopped_at);
    else
        Py_DECREF(records);
    Py_XDECREF(base);
    Py_XDECREF(stopped_at);
    return result;
}

/* ------------------------------------------------------------------ down-conversion */

/* What one batch's conversion wrote. */
typedef struct {
    int64_t count, first_offset, last_offset, max_timestamp;
} DownStats;

/* Append one legacy message; returns -1 (failure set) when out of memory. */
static int append_legacy(Output *out, int magic, int64_t offset, int attributes, int64_t timestamp,
                         const uint8_t *key, int64_t key_length, const uint8_t *value,
                         int64_t value_length, Failure *f)
{
    size_t key_bytes = key_length > 0 ? (size_t)key_length : 0;
    size_t value_bytes = value_length > 0 ? (size_t)value_length : 0;
    size_t size = (magic == 1 ? LEGACY_V1_OVERHEAD_BYTES : LEGACY_V0_OVERHEAD_BYTES) + key_bytes +
                  value_bytes;
    if (size > INT32_MAX)
        return fail(f, FAIL_CORRUPT, "record at offset %lld is too large for a legacy message",
                    (long long)offset);
    if (reserve(out, LOG_OVERHEAD_BYTES + size, f))
        return -1;
    uint8_t *p = out->data + out->length;
    put_be64_at(p, (uint64_t)offset);
    put_be32_at(p + 8, (uint32_t)size);
    uint8_t *message = p + LOG_OVERHEAD_BYTES, *q = message + 4;
    *q++ = (uint8_t)magic;
    *q++ = (uint8_t)attributes;
    if (magic == 1) {
        put_be64_at(q, (uint64_t)timestamp);
        q += 8;
    }
    put_be32_at(q, (uint32_t)(key_length < 0 ? -1 : key_length));
    q += 4;
    if (key_bytes)
        memcpy(q, key, key_bytes);
    q += key_bytes;
    put_be32_at(q, (uint32_t)(value_length < 0 ? -1 : value_length));
    q += 4;
    if (value_bytes)
        memcpy(q, value, value_bytes);
    put_be32_at(message, crc32_ieee(message + 4, size - 4));
    out->length += LOG_OVERHEAD_BYTES + size;
    return 0;
}

/* Skip a varint-length field (key, value or header part) of a v2 record; -1 if malformed. */
static int v2_field(const uint8_t **p, const uint8_t *end, const uint8_t **start, int64_t *length)
{
    if (read_signed_varint(p, end, VARINT_MAX_BYTES, length) || *length < -1 || end - *p < *length)
        return -1;
    *start = *p;
    if (*length > 0)
        *p += *length;
    return 0;
}

/*
 * Append the legacy messages of the records of one v2 batch (header: its 61 bytes; records:
 * its records section, decompressed). compressed: the messages go inside a wrapper, so
 * every record is kept and magic 1 offsets are relative to the first record's; otherwise
 * records before first_offset are dropped. Headers are dropped (magic 0/1 have none).
 */
static int batch_to_legacy(const uint8_t *header, const uint8_t *records, size_t records_length,
                           int to_magic, int64_t first_offset, int compressed, Output *out,
                           DownStats *stats, Failure *f)
{
    int64_t base_offset = (int64_t)be64(header);
    int attributes = (header[BATCH_ATTRIBUTES_AT] << 8) | header[BATCH_ATTRIBUTES_AT + 1];
    int log_append_time = attributes & TIMESTAMP_TYPE_BIT;
    int64_t base_timestamp = (int64_t)be64(header + BATCH_BASE_TIMESTAMP_AT);
    int64_t batch_max_timestamp = (int64_t)be64(header + BATCH_MAX_TIMESTAMP_AT);
    int32_t count = (int32_t)be32(header + BATCH_RECORDS_COUNT_AT);
    int message_attributes = to_magic == 1 && log_append_time ? LEGACY_TIMESTAMP_TYPE_BIT : 0;
    const uint8_t *p = records, *end = records + records_length;
    *stats = (DownStats){0, -1, -1, NO_TIMESTAMP};
    if (count < 0)
        return fail(f, FAIL_CORRUPT, "batch at offset %lld has a negative record count",
                    (long long)base_offset);
    for (int32_t i = 0; i < count; i++) {
        int64_t length, timestamp_delta, offset_delta, key_length, value_length, header_count;
        const uint8_t *key, *value, *ignored;
        if (read_signed_varint(&p, end, VARINT_MAX_BYTES, &length) || length <= 0 || end - p < length)
            goto malformed;
        const uint8_t *record_end = p + length;
        p++; /* attributes */
        if (read_signed_varint(&p, record_end, VARLONG_MAX_BYTES, &timestamp_delta) ||
            read_signed_varint(&p, record_end, VARINT_MAX_BYTES, &offset_delta) ||
            v2_field(&p, record_end, &key, &key_length) ||
            v2_field(&p, record_end, &value, &value_length) ||
            read_signed_varint(&p, record_end, VARINT_MAX_BYTES, &header_count) || header_count < 0)
            goto malformed;
        for (int64_t h = 0; h < header_count; h++) {
            int64_t part_length;
            if (v2_field(&p, record_end, &ignored, &part_length) ||
                v2_field(&p, record_end, &ignored, &part_length))
                goto malformed;
        }
        if (p != record_end)
            goto malformed;
        int64_t offset = base_offset + offset_delta;
        if (!compressed && offset < first_offset)
            continue;
        int64_t timestamp = log_append_time ? batch_max_timestamp
                                            : (int64_t)((uint64_t)base_timestamp + (uint64_t)timestamp_delta);
        if (stats->count == 0)
            stats->first_offset = offset;
        int64_t written_offset = compressed && to_magic == 1 ? offset - stats->first_offset : offset;
        if (append_legacy(out, to_magic, written_offset, message_attributes, timestamp, key,
                          key_length, value, value_length, f))
            return -1;
        stats->count++;
        stats->last_offset = offset;
        if (timestamp > stats->max_timestamp)
            stats->max_timestamp = timestamp;
    }
    return 0;
malformed:
    return fail(f, FAIL_CORRUPT, "a record of the batch at offset %lld is malformed",
                (long long)base_offset);
}

/*
 * Convert the whole uncompressed v2 batches of buf from *pos, skipping control batches;
 * stop at a compressed batch, a partial one or the end. *first_bytes: the output length
 * once the first batch that wrote anything has (0 while none has).
 */
static int plain_batches_to_legacy(const uint8_t *buf, size_t length, size_t *pos, int to_magic,
                                   int64_t first_offset, Output *out, size_t *first_bytes,
                                   Failure *f)
{
    while (length - *pos >= BATCH_HEADER_BYTES) {
        const uint8_t *batch = buf + *pos;
        int64_t batch_length = (int32_t)be32(batch + 8);
        if (batch[BATCH_MAGIC_AT] != CURRENT_MAGIC || batch_length < BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES)
            return fail(f, FAIL_CORRUPT, "entry at byte %zu is not a v2 record batch", *pos);
        size_t size = (size_t)batch_length + LOG_OVERHEAD_BYTES;
        if (size > length - *pos)
            return 0; /* a partial batch: the end of what a fetch returns */
        int attributes = (batch[BATCH_ATTRIBUTES_AT] << 8) | batch[BATCH_ATTRIBUTES_AT + 1];
        if (attributes & CODEC_MASK)
            return 0;
        if (!(attributes & CONTROL_BIT)) {
            DownStats stats;
            if (batch_to_legacy(batch, batch + BATCH_HEADER_BYTES, size - BATCH_HEADER_BYTES,
                                to_magic, first_offset, 0, out, &stats, f))
                return -1;
            if (stats.count && !*first_bytes)
                *first_bytes = out->length;
        }
        *pos += size;
    }
    return 0;
}

/*
 * plain_batches_to_legacy(buf, position, to_magic, first_offset)
 *   -> (messages: bytes, position, first_batch_bytes)
 */
static PyObject *py_plain_batches_to_legacy(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t position;
    int to_magic;
    long long first_offset;
    if (!PyArg_ParseTuple(args, "y*niL", &view, &position, &to_magic, &first_offset))
        return NULL;
    if (position < 0 || position > view.len || (to_magic != 0 && to_magic != 1)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "position outside the buffer or magic not 0 or 1");
        return NULL;
    }
    size_t pos = (size_t)position, first_bytes = 0;
    Output out = {0};
    Failure failure = {FAIL_NONE, ""};
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = plain_batches_to_legacy(view.buf, (size_t)view.len, &pos, to_magic, first_offset,
                                     &out, &first_bytes, &failure);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (status) {
        free(out.data);
        return raise_failure(&failure);
    }
    PyObject *messages = output_to_bytes(&out);
    return messages ? Py_BuildValue("(Nnn)", messages, (Py_ssize_t)pos, (Py_ssize_t)first_bytes)
                    : NULL;
}

/*
 * batch_records_to_legacy(header, records, to_magic)
 *   -> (messages: bytes, count, first_offset, last_offset, max_timestamp)
 * The inner messages of the wrapper one compressed batch becomes (records decompressed).
 */
static PyObject *py_batch_records_to_legacy(PyObject *self, PyObject *args)
{
    Py_buffer header, records;
    int to_magic;
    if (!PyArg_ParseTuple(args, "y*y*i", &header, &records, &to_magic))
        return NULL;
    if (header.len < BATCH_HEADER_BYTES || (to_magic != 0 && to_magic != 1)) {
        PyBuffer_Release(&header);
        PyBuffer_Release(&records);
        PyErr_SetString(PyExc_ValueError, "a batch header is 61 bytes; magic must be 0 or 1");
        return NULL;
    }
    Output out = {0};
    Failure failure = {FAIL_NONE, ""};
    DownStats stats;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = batch_to_legacy(header.buf, records.buf, (size_t)records.len, to_magic, 0, 1, &out,
                             &stats, &failure);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&header);
    PyBuffer_Release(&records);
    if (status) {
        free(out.data);
        return raise_failure(&failure);
    }
    PyObject *messages = output_to_bytes(&out);
    return messages ? Py_BuildValue("(NLLLL)", messages, (long long)stats.count,
                                    (long long)stats.first_offset, (long long)stats.last_offset,
                                    (long long)stats.max_timestamp)
                    : NULL;
}

/* legacy_message(offset, magic, attributes, timestamp, key, value) -> bytes (one message). */
static PyObject *py_legacy_message(PyObject *self, PyObject *args)
{
    long long offset, timestamp;
    int magic, attributes;
    Py_buffer key = {0}, value = {0};
    PyObject *key_object, *value_object;
    if (!PyArg_ParseTuple(args, "LiiLOO", &offset, &magic, &attributes, &timestamp, &key_object,
                          &value_object))
        return NULL;
    if ((magic != 0 && magic != 1) || attributes < 0 || attributes > 0xFF) {
        PyErr_SetString(PyExc_ValueError, "magic must be 0 or 1, attributes one byte");
        return NULL;
    }
    if (key_object != Py_None && PyObject_GetBuffer(key_object, &key, PyBUF_SIMPLE))
        return NULL;
    if (value_object != Py_None && PyObject_GetBuffer(value_object, &value, PyBUF_SIMPLE)) {
        if (key.obj)
            PyBuffer_Release(&key);
        return NULL;
    }
    Output out = {0};
    Failure failure = {FAIL_NONE, ""};
    int status = append_legacy(&out, magic, offset, attributes, timestamp, key.buf,
                               key.obj ? key.len : -1, value.buf, value.obj ? value.len : -1,
                               &failure);
    if (key.obj)
        PyBuffer_Release(&key);
    if (value.obj)
        PyBuffer_Release(&value);
    if (status) {
        free(out.data);
        return raise_failure(&failure);
    }
    return output_to_bytes(&out);
}

/* crc32(data) -> int: CRC-32 (IEEE) as zlib.crc32 computes it. */
static PyObject *py_crc32(PyObject *self, PyObject *args)
{
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view))
        return NULL;
    uint32_t crc;
    Py_BEGIN_ALLOW_THREADS
    crc = crc32_ieee(view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef methods[] = {
    {"legacy_to_records", py_legacy_to_records, METH_VARARGS,
     "Legacy messages -> v2 records section, stopping after a compressed wrapper."},
    {"plain_batches_to_legacy", py_plain_batches_to_legacy, METH_VARARGS,
     "Uncompressed v2 batches -> legacy messages, stopping at a compressed batch."},
    {"batch_records_to_legacy", py_batch_records_to_legacy, METH_VARARGS,
     "One compressed batch's decompressed records -> the inner legacy messages."},
    {"legacy_message", py_legacy_message, METH_VARARGS, "One legacy message with its CRC-32."},
    {"crc32", py_crc32, METH_VARARGS, "CRC-32 (IEEE), as zlib.crc32."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_message_format",
    "Magic 0/1 message sets <-> v2 records (see message_format.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__message_format(void)
{
    crc32_init_tables();
    if (kernel_common_init() < 0)
        return NULL;
    return PyModule_Create(&module);
}
