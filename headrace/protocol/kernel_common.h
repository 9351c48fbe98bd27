/*
 * kernel_common.h -- what every compiled module of headrace shares: static functions
 * compiled into each extension that includes it (no C symbol crosses extensions).
 *
 * Owns the v2 batch layout constants, Failure (an error recorded without the GIL, raised with
 * it as headrace.errors.CorruptMessage / InvalidRecord or a builtin exception), Buf (growable
 * malloc'd output) and OwnedBuffer (a Buf handed to Python without a copy), big-endian loads
 * and stores, the bounds-checked Cursor with Kafka's zigzag varints, and unsigned varint
 * output.
 *
 * An including .c file defines KERNEL_MODULE_NAME (its extension's dotted name, which names its
 * OwnedBuffer type) first and, if it raises failures or hands out OwnedBuffers, calls
 * kernel_common_init() from its PyInit function. Every extension but the broker's one-store
 * _scheduling includes it: the record kernel, storage's segment I/O and the Spark encoder
 * (through record_batches.h or crc32c.h), the message-format conversion (failures, big-endian
 * loads and stores) and the request pre-pass (read_uvarint, big-endian loads).
 *
 * Layer: protocol, so the C of any layer may include it (tests/test_layers.py checks C includes
 * by the Python layer rule).
 *
 * Thread-safety: the exception objects and the OwnedBuffer type are set once at module init,
 * with the GIL; everything else is reentrant. fail() needs no GIL; raise_failure(),
 * buf_to_owned() and bufs_to_tuple() need it.
 */
#ifndef HEADRACE_PROTOCOL_KERNEL_COMMON_H
#define HEADRACE_PROTOCOL_KERNEL_COMMON_H

/* Not every includer uses every function here. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#ifndef KERNEL_MODULE_NAME
#error "define KERNEL_MODULE_NAME (the extension's dotted name) before including kernel_common.h"
#endif

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = KERNEL_MODULE_NAME ".OwnedBuffer",
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

static uint16_t be16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

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

static void free_bufs(Buf *bufs, int buf_count)
{
    for (int i = 0; i < buf_count; i++) {
        free(bufs[i].data);
        bufs[i].data = NULL;
    }
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


/* The shared state's module init: the OwnedBuffer type and headrace.errors' exceptions. 0, or
 * -1 with an exception set. */
static int kernel_common_init(void)
{
    if (PyType_Ready(&OwnedBufferType) < 0)
        return -1;
    PyObject *errors = PyImport_ImportModule("headrace.errors");
    if (errors == NULL)
        return -1;
    corrupt_message_error = PyObject_GetAttrString(errors, "CorruptMessage");
    invalid_record_error = PyObject_GetAttrString(errors, "InvalidRecord");
    Py_DECREF(errors);
    return corrupt_message_error == NULL || invalid_record_error == NULL ? -1 : 0;
}

#pragma GCC diagnostic pop

#endif /* HEADRACE_PROTOCOL_KERNEL_COMMON_H */
