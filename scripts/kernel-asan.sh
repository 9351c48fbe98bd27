#!/usr/bin/env bash
# Builds every C extension of setup.py with AddressSanitizer and UBSan into build/kernel-asan/
# and runs each one's tests against it:
#   protocol  _kernel, _prepass, _message_format: tests/protocol/test_kernel*.py (the batch
#             fuzzer among them), test_prepass.py, test_message_format.py, and
#             tests/fuzz/test_wire_decode_fuzz.py, which feeds the walker the wire fuzzer's
#             malformed requests;
#   storage   _segment_io: tests/storage/test_segment_io*.py (plain append, recovery scan,
#             cleaner passes and spans, page-cache probes, O_DIRECT reads);
#   spark     _encoder: tests/spark/test_encoder*.py (its column fuzzer among them) and
#             test_sink_encode.py;
#   broker    _scheduling: tests/broker/test_scheduling.py.
# A second build shrinks HELD_VIEWS_MAX so that the encoder's held-buffer bounds check is
# reached. Any sanitizer finding aborts the run (non-zero exit).
#
# The sources are copied into build/kernel-asan/<variant>/ so the sanitized extensions are
# imported instead of the regular ones; the worktree's own *.so are left alone.
# CPython's interpreter is not sanitized: libasan is preloaded, and leak detection is off
# (CPython keeps memory until exit by design). Needs gcc (libasan and libubsan come with it).
#
# Usage: scripts/kernel-asan.sh [PYTHON]   (default: .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${1:-.venv/bin/python}
PYTHON=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")
ROOT=$PWD
OUT=$ROOT/build/kernel-asan
SANITIZE="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
LIBASAN=$(gcc -print-file-name=libasan.so)
if [ ! -e "$LIBASAN" ]; then
    echo "kernel-asan: gcc has no libasan.so ($LIBASAN); install gcc's libasan" >&2
    exit 1
fi

# build VARIANT EXTRA_CFLAGS: a copy of the package and its tests with sanitized extensions.
build() {
    local variant=$1 extra=$2 dir=$OUT/$1
    rm -rf "$dir"
    mkdir -p "$dir"
    cp -r "$ROOT/headrace" "$ROOT/tests" "$ROOT/pyproject.toml" "$ROOT/setup.py" \
        "$ROOT/README.md" "$dir/"
    find "$dir" \( -name '*.so' -o -name '__pycache__' \) -prune -exec rm -rf {} +
    (cd "$dir" && CFLAGS="-O1 -g $SANITIZE $extra" LDFLAGS="$SANITIZE" \
        "$PYTHON" setup.py -q build_ext --inplace --build-temp "$OUT/tmp-$variant" >/dev/null)
}

# run VARIANT PYTEST_ARGS...: pytest in the copy, under the sanitizers.
run() {
    local dir=$OUT/$1
    shift
    (cd "$dir" && env PYTHONPATH="$dir" LD_PRELOAD="$LIBASAN" \
        ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:abort_on_error=1:print_summary=1 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "$PYTHON" -m pytest -q -p no:cacheprovider --capture=sys -W ignore "$@")
}

build default ""
run default tests/protocol/test_kernel*.py tests/protocol/test_prepass.py \
    tests/protocol/test_message_format.py tests/fuzz/test_wire_decode_fuzz.py \
    tests/storage/test_segment_io*.py \
    tests/spark/test_encoder*.py tests/spark/test_sink_encode.py \
    tests/broker/test_scheduling.py
build small-held-views "-DHELD_VIEWS_MAX=8"
run small-held-views tests/spark/test_encoder_bounds.py
