"""A sampling profiler of every thread of a Python program, for the broker under load.

Runs a module (``-- -m headrace.cli.main broker ...``) or a script in this process with a
daemon thread that, every ``--interval-ms``, takes ``sys._current_frames()`` and counts, per
thread name, each function's own samples (the innermost frame) and inclusive samples (every
function on the stack, once per sample). At exit it writes the counts to ``--out`` as text:
per thread, its sample count and the ``--top`` functions by inclusive and by own samples.
py-spy cannot attach on these machines and perf gets no samples; this needs neither.

The sampler runs only when it holds the GIL: a thread inside a C call that keeps the GIL is
seen once that call returns (at the Python line that made it), one that releases it (I/O,
most codecs) is seen inside that call's Python caller. Counts, not times: multiply by the
interval for an estimate. The sampling thread owns its counters; they are read once, at exit.

    python bench/sampling_profiler.py --out /tmp/profile.txt -- -m headrace.cli.main broker
"""

from __future__ import annotations

import argparse
import atexit
import collections
import runpy
import sys
import threading
import time

DEFAULT_INTERVAL_MS = 2.0
DEFAULT_TOP = 40


class Sampler:
    def __init__(self, interval_ms: float) -> None:
        self.interval_s = interval_ms / 1000
        self.own: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.inclusive: dict[str, collections.Counter] = collections.defaultdict(
            collections.Counter)
        self.samples: collections.Counter = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval_s):
            names = {thread.ident: thread.name for thread in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    self._count(names.get(ident, str(ident)), frame)

    def _count(self, thread_name: str, frame) -> None:
        self.samples[thread_name] += 1
        self.own[thread_name][_where(frame)] += 1
        seen = set()
        while frame is not None:
            where = _where(frame)
            if where not in seen:
                seen.add(where)
                self.inclusive[thread_name][where] += 1
            frame = frame.f_back

    def report(self, top: int) -> str:
        lines = [f"interval {self.interval_s * 1000:.1f} ms"]
        for thread_name, count in self.samples.most_common():
            lines.append(f"\n== thread {thread_name}: {count} samples")
            lines.append("-- inclusive")
            lines += [f"{n:8d} {where}" for where, n in self.inclusive[thread_name].most_common(top)]
            lines.append("-- own")
            lines += [f"{n:8d} {where}" for where, n in self.own[thread_name].most_common(top)]
        return "\n".join(lines) + "\n"


def _where(frame) -> str:
    code = frame.f_code
    return f"{code.co_filename}:{code.co_firstlineno}:{code.co_qualname}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--interval-ms", type=float, default=DEFAULT_INTERVAL_MS)
    parser.add_argument("--top", type=int, default=DEFAULT_TOP)
    parser.add_argument("program", nargs=argparse.REMAINDER,
                        help="-- -m MODULE ARGS... or -- SCRIPT ARGS...")
    args = parser.parse_args()
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    sampler = Sampler(args.interval_ms)
    started = time.monotonic()

    def write_report() -> None:
        sampler.stop()
        with open(args.out, "w") as out:
            out.write(f"wall {time.monotonic() - started:.1f} s\n" + sampler.report(args.top))

    atexit.register(write_report)
    sampler.start()
    if program[0] == "-m":
        sys.argv = [program[1], *program[2:]]
        runpy.run_module(program[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = program
        runpy.run_path(program[0], run_name="__main__")


if __name__ == "__main__":
    main()
