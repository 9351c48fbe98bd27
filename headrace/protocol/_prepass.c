/*
 * headrace.protocol._prepass -- the request pre-pass's walker.
 *
 * Owns one function, walk(program, frame, position): a structural walk of a Kafka request
 * body that checks every length and count read from the frame against the bytes left,
 * before kio's native reader (which sizes allocations from them unchecked) sees the frame.
 * Nothing is allocated from a wire value; nothing is decoded.
 *
 * The program is compiled in Python (headrace/protocol/prepass.py) from kio's dataclass
 * schema, once per request class, as native int32 words:
 *
 *   header   flexible, struct_count, op_count, tag_count
 *   structs  struct_count x (first_op, op_count, first_tag, tag_count); struct 0 is the body
 *   ops      op_count x (opcode, a, b, c)
 *   tags     tag_count x (tag, op index): a struct's known tagged fields
 *
 * Opcodes (a, b, c):
 *   FIXED          (bytes, -, -)                      a run of fixed-width fields
 *   STRING         (-, nullable, -)                   int16 length, or compact
 *   BYTES          (-, nullable, -)                   int32 length, or compact (records too)
 *   STRUCT         (struct, nullable, -)              nullable: int8 marker, < 0 is null
 *   ARRAY_FIXED    (item bytes, nullable, -)
 *   ARRAY_STRING   (-, nullable, -)                   items are non-null strings
 *   ARRAY_STRUCT   (struct, nullable, item min bytes)
 * Compact lengths and counts are unsigned varints (at most 5 bytes) holding length + 1,
 * 0 meaning null; legacy ones are signed, -1 meaning null. Every struct of a flexible
 * version ends with a tagged-field section: count, then (tag, size, data); a known tag's
 * data must be exactly one value of its field, an unknown one is skipped.
 *
 * Rules: a length must fit in the bytes left; a count of N items needs N x the item's
 * minimum encoded size; null only where the schema allows it; a negative legacy length
 * other than -1 is malformed. The first violation is returned as (message, op index)
 * (op index -1 for a tagged-field section), else None.
 *
 * Thread-safety: no state; the walk holds the GIL (it is short: lengths only).
 */
#define KERNEL_MODULE_NAME "headrace.protocol._prepass"
#include "kernel_common.h" /* read_uvarint over a Cursor, big-endian loads */

#define HEADER_WORDS 4
#define STRUCT_WORDS 4
#define OP_WORDS 4
#define TAG_WORDS 2
#define MAX_DEPTH 32
#define MESSAGE_BYTES 160
#define MAX_UVARINT_BYTES 5

enum {
    OP_FIXED, OP_STRING, OP_BYTES, OP_STRUCT, OP_ARRAY_FIXED, OP_ARRAY_STRING, OP_ARRAY_STRUCT,
};

typedef struct {
    const int32_t *structs;
    const int32_t *ops;
    const int32_t *tags;
    int32_t struct_count, op_count, tag_count;
    int flexible;
} Program;

typedef struct {
    const uint8_t *data;
    Py_ssize_t position, end;
    const Program *program;
    int32_t failed_op;
    char message[MESSAGE_BYTES];
} Walk;

static int walk_fail(Walk *w, int32_t op, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(w->message, sizeof w->message, fmt, args);
    va_end(args);
    w->failed_op = op;
    return -1;
}

static Py_ssize_t left(const Walk *w) { return w->end - w->position; }

static int walk_uvarint(Walk *w, int32_t op, uint64_t *value)
{
    Cursor c = {w->data + w->position, w->data + w->end};
    int status = read_uvarint(&c, MAX_UVARINT_BYTES, value);
    Py_ssize_t consumed = c.p - (w->data + w->position);
    w->position += consumed;
    if (status == 0)
        return 0;
    if (consumed < MAX_UVARINT_BYTES) /* the frame ended inside it */
        return walk_fail(w, op, "unsigned varint overruns the frame");
    return walk_fail(w, op, "unsigned varint longer than %d bytes", MAX_UVARINT_BYTES);
}

static int read_be(Walk *w, int32_t op, int width, int64_t *value)
{
    if (left(w) < width)
        return walk_fail(w, op, "%d-byte length overruns the frame", width);
    const uint8_t *p = w->data + w->position;
    w->position += width;
    *value = width == 2 ? (int16_t)be16(p) : (int32_t)be32(p);
    return 0;
}

/* A length or count: compact (uvarint - 1) if flexible, else a signed legacy_width-byte
 * integer. *length is -1 for null (after checking the schema allows it). */
static int read_length(Walk *w, int32_t op, int legacy_width, int nullable, int64_t *length)
{
    if (w->program->flexible) {
        uint64_t raw;
        if (walk_uvarint(w, op, &raw) < 0)
            return -1;
        *length = (int64_t)raw - 1;
    } else if (read_be(w, op, legacy_width, length) < 0) {
        return -1;
    } else if (*length < -1) {
        return walk_fail(w, op, "negative length %lld", (long long)*length);
    }
    if (*length == -1 && !nullable)
        return walk_fail(w, op, "non-nullable field was serialized as null");
    return 0;
}

static int skip(Walk *w, int32_t op, int64_t bytes)
{
    if (bytes > left(w))
        return walk_fail(w, op, "%lld bytes overrun the %lld bytes left", (long long)bytes,
                    (long long)left(w));
    w->position += (Py_ssize_t)bytes;
    return 0;
}

static int check_count(Walk *w, int32_t op, int64_t count, int64_t item_min_bytes)
{
    if (item_min_bytes < 1)
        item_min_bytes = 1;
    if (count > left(w) / item_min_bytes)
        return walk_fail(w, op, "array of %lld items (at least %lld bytes each) overruns the "
                    "%lld bytes left", (long long)count, (long long)item_min_bytes,
                    (long long)left(w));
    return 0;
}

static int walk_struct(Walk *w, int32_t index, int depth);

static int walk_op(Walk *w, int32_t op, int depth)
{
    const int32_t *o = w->program->ops + (Py_ssize_t)op * OP_WORDS;
    int32_t a = o[1], nullable = o[2];
    int64_t length;
    switch (o[0]) {
    case OP_FIXED:
        return skip(w, op, a);
    case OP_STRING:
    case OP_BYTES:
        if (read_length(w, op, o[0] == OP_STRING ? 2 : 4, nullable, &length) < 0)
            return -1;
        return length < 0 ? 0 : skip(w, op, length);
    case OP_STRUCT:
        if (nullable) {
            int64_t marker;
            if (left(w) < 1)
                return walk_fail(w, op, "struct marker overruns the frame");
            marker = (int8_t)w->data[w->position++];
            if (marker < 0)
                return 0;
        }
        return walk_struct(w, a, depth + 1);
    case OP_ARRAY_FIXED:
    case OP_ARRAY_STRING:
    case OP_ARRAY_STRUCT: {
        if (read_length(w, op, 4, nullable, &length) < 0)
            return -1;
        if (length < 0)
            return 0;
        int flexible = w->program->flexible;
        int64_t item_min_bytes = o[0] == OP_ARRAY_FIXED ? a
                                 : o[0] == OP_ARRAY_STRING ? (flexible ? 1 : 2) : o[3];
        if (check_count(w, op, length, item_min_bytes) < 0)
            return -1;
        if (o[0] == OP_ARRAY_FIXED)
            return skip(w, op, length * a);
        for (int64_t i = 0; i < length; i++) {
            if (o[0] == OP_ARRAY_STRING) {
                int64_t item_length;
                if (read_length(w, op, 2, 0, &item_length) < 0 || skip(w, op, item_length) < 0)
                    return -1;
            } else if (walk_struct(w, a, depth + 1) < 0) {
                return -1;
            }
        }
        return 0;
    }
    default:
        return walk_fail(w, op, "bad opcode %d", o[0]);
    }
}

/* One known tagged field: its value must fill its ``size`` bytes exactly. */
static int walk_tagged_value(Walk *w, int32_t op, int64_t size, int depth)
{
    Py_ssize_t outer_end = w->end, value_end = w->position + (Py_ssize_t)size;
    w->end = value_end;
    int status = walk_op(w, op, depth);
    w->end = outer_end;
    if (status < 0)
        return -1;
    if (w->position != value_end)
        return walk_fail(w, op, "tagged field of %lld bytes holds %lld bytes of value",
                    (long long)size, (long long)(w->position - (value_end - size)));
    return 0;
}

static int walk_tagged_fields(Walk *w, const int32_t *s, int depth)
{
    uint64_t count, tag, size;
    if (walk_uvarint(w, -1, &count) < 0)
        return -1;
    for (uint64_t i = 0; i < count; i++) {
        if (walk_uvarint(w, -1, &tag) < 0 || walk_uvarint(w, -1, &size) < 0)
            return -1;
        if ((int64_t)size > left(w))
            return walk_fail(w, -1, "tagged field %llu of %llu bytes overruns the %lld bytes left",
                        (unsigned long long)tag, (unsigned long long)size, (long long)left(w));
        int32_t known_op = -1;
        for (int32_t t = s[2]; t < s[2] + s[3]; t++) {
            if ((uint64_t)w->program->tags[t * TAG_WORDS] == tag)
                known_op = w->program->tags[t * TAG_WORDS + 1];
        }
        if (known_op < 0)
            w->position += (Py_ssize_t)size;
        else if (walk_tagged_value(w, known_op, (int64_t)size, depth) < 0)
            return -1;
    }
    return 0;
}

static int walk_struct(Walk *w, int32_t index, int depth)
{
    if (depth > MAX_DEPTH)
        return walk_fail(w, -1, "structs nested deeper than %d", MAX_DEPTH);
    const int32_t *s = w->program->structs + (Py_ssize_t)index * STRUCT_WORDS;
    for (int32_t op = s[0]; op < s[0] + s[1]; op++) {
        if (walk_op(w, op, depth) < 0)
            return -1;
    }
    return w->program->flexible ? walk_tagged_fields(w, s, depth) : 0;
}

/* Parse and bounds-check the program's tables (our own compiler made it; checked anyway,
 * so that a bad program is a Python error, never a read out of bounds). */
static int load_program(const Py_buffer *view, Program *p)
{
    const int32_t *words = view->buf;
    Py_ssize_t word_count = view->len / (Py_ssize_t)sizeof(int32_t);
    if (word_count < HEADER_WORDS)
        goto bad;
    p->flexible = words[0] != 0;
    p->struct_count = words[1];
    p->op_count = words[2];
    p->tag_count = words[3];
    if (p->struct_count < 1 || p->op_count < 0 || p->tag_count < 0
        || word_count != HEADER_WORDS + (Py_ssize_t)p->struct_count * STRUCT_WORDS
                          + (Py_ssize_t)p->op_count * OP_WORDS
                          + (Py_ssize_t)p->tag_count * TAG_WORDS)
        goto bad;
    p->structs = words + HEADER_WORDS;
    p->ops = p->structs + (Py_ssize_t)p->struct_count * STRUCT_WORDS;
    p->tags = p->ops + (Py_ssize_t)p->op_count * OP_WORDS;
    for (int32_t i = 0; i < p->struct_count; i++) {
        const int32_t *s = p->structs + i * STRUCT_WORDS;
        if (s[0] < 0 || s[1] < 0 || s[0] + s[1] > p->op_count || s[2] < 0 || s[3] < 0
            || s[2] + s[3] > p->tag_count)
            goto bad;
    }
    for (int32_t i = 0; i < p->op_count; i++) {
        const int32_t *o = p->ops + i * OP_WORDS;
        int is_struct = o[0] == OP_STRUCT || o[0] == OP_ARRAY_STRUCT;
        if (o[0] < OP_FIXED || o[0] > OP_ARRAY_STRUCT || o[1] < 0
            || (is_struct && o[1] >= p->struct_count))
            goto bad;
    }
    for (int32_t i = 0; i < p->tag_count; i++) {
        int32_t op = p->tags[i * TAG_WORDS + 1];
        if (op < 0 || op >= p->op_count)
            goto bad;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "malformed pre-pass program");
    return -1;
}

static PyObject *py_walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "walk(program, frame, position)");
        return NULL;
    }
    Py_ssize_t position = PyLong_AsSsize_t(args[2]);
    if (position == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer program_view, frame_view;
    if (PyObject_GetBuffer(args[0], &program_view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &frame_view, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&program_view);
        return NULL;
    }
    PyObject *result = NULL;
    Program program;
    if (load_program(&program_view, &program) == 0) {
        if (position < 0 || position > frame_view.len) {
            PyErr_SetString(PyExc_ValueError, "position outside the frame");
        } else {
            Walk w = {frame_view.buf, position, frame_view.len, &program, -1, {0}};
            if (walk_struct(&w, 0, 0) == 0) {
                result = Py_NewRef(Py_None);
            } else {
                result = Py_BuildValue("(si)", w.message, (int)w.failed_op);
            }
        }
    }
    PyBuffer_Release(&frame_view);
    PyBuffer_Release(&program_view);
    return result;
}

static PyMethodDef prepass_methods[] = {
    {"walk", (PyCFunction)(void (*)(void))py_walk, METH_FASTCALL,
     "walk(program, frame, position) -> None if every length and count in the request body "
     "at position fits, else (message, op index) of the first that does not."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef prepass_module = {
    PyModuleDef_HEAD_INIT, "headrace.protocol._prepass",
    "Request pre-pass walker; use headrace.protocol.prepass.", -1, prepass_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__prepass(void)
{
    return PyModule_Create(&prepass_module);
}
