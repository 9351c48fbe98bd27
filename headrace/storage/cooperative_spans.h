/*
 * cooperative_spans.h -- the clocks of storage's cooperative cleaner spans, and the one word
 * through which an upper layer tells them that requests are being served.
 *
 * headrace.storage._segment_io owns the word: the CLOCK_MONOTONIC time, in nanoseconds, of the
 * latest request (0: none yet). A niced span loads it after each chunk and pauses while
 * requests keep coming (see "cooperative spans" in _segment_io.c). The extension exports the
 * word's address as a capsule named BROKER_REQUEST_CAPSULE (module attribute
 * broker_request_ns); the broker's C (headrace.broker._scheduling, note_broker_request)
 * imports it and stores monotonic_ns() there on every request, so the layer that serves
 * requests signals the layer that cleans without storage knowing who signals.
 *
 * Layer: storage (includes only system headers).
 *
 * Thread-safety: the word is written and read with relaxed atomic stores and loads, from any
 * thread, without the GIL; the clocks are reentrant.
 */
#ifndef HEADRACE_STORAGE_COOPERATIVE_SPANS_H
#define HEADRACE_STORAGE_COOPERATIVE_SPANS_H

#include <stdint.h>
#include <time.h>

#define BROKER_REQUEST_CAPSULE "headrace.storage._segment_io.broker_request_ns"

static inline int64_t clock_ns(clockid_t clock)
{
    struct timespec now;
    clock_gettime(clock, &now);
    return (int64_t)now.tv_sec * 1000000000LL + now.tv_nsec;
}

static inline int64_t monotonic_ns(void)
{
    return clock_ns(CLOCK_MONOTONIC);
}

#endif /* HEADRACE_STORAGE_COOPERATIVE_SPANS_H */
