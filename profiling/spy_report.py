"""Compare where two engines spend host time, from py-spy's raw (collapsed) stacks.

    python profiling/spy_report.py spy_plugin.txt spy_vllm.txt [--within run_busy_loop] [--rate 50]

Each input is ``py-spy record --subprocesses -f raw`` output (``vllm_session.sh e2e80`` with
SPY80=1): one line per distinct stack, ``frame;frame;...;frame COUNT``, the root frame naming
the process. Only stacks with a frame whose function is ``--within`` count (default: vLLM's
engine-core loop, so start-up and idle time drop out). A function's inclusive samples are the
stacks it appears in (once per stack, recursion or not); milliseconds are samples / rate. Both
engines ran the same requests, so the difference of two columns is host time one spent and the
other did not.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """``func (path/to/file.py:123)`` -> ``func (file.py)``: a function, whatever line it is at."""
    if frame.startswith("process "):  # py-spy's process frames: pids differ between runs
        return "process"
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    return f"{m['func']} ({m['file'].rsplit('/', 1)[-1]})"


def _is(name: str, func: str) -> bool:
    """Whether frame ``name`` is function ``func`` (py-spy names methods ``Class.method``)."""
    f = name.split(" (")[0]
    return f == func or f.endswith("." + func)


def read_stacks(path: str, within: str | None) -> list[tuple[list[str], int]]:
    """The stacks of ``path`` (frames root first, counts) that pass through ``within``."""
    out = []
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            # (a process frame quotes its command line, which may hold ";")
            frames = [frame_name(x) for x in re.sub(r'"[^"]*"', '""', stack).split(";")]
            if within and not any(_is(x, within) for x in frames):
                continue
            out.append((frames, int(count)))
    return out


def inclusive(stacks) -> tuple[Counter, int]:
    """Per function, the samples of the stacks it is in; and all samples."""
    c, total = Counter(), 0
    for frames, n in stacks:
        total += n
        for name in set(frames):
            c[name] += n
    return c, total


def compare(paths: list[str], within: str | None, rate: float, top: int = 40) -> str:
    counts = [inclusive(read_stacks(p, within)) for p in paths]
    names = set().union(*(c for c, _ in counts))
    lines = ["samples inside %r: %s (%s ms at %g Hz)" % (
        within, ", ".join(str(t) for _, t in counts),
        ", ".join(f"{t / rate * 1e3:.0f}" for _, t in counts), rate)]
    head = " | ".join(f"{p.rsplit('/', 1)[-1][:18]:>18}" for p in paths)
    lines.append(f"{head} | {'diff ms':>8} | function (inclusive ms)")
    first, last = counts[0][0], counts[-1][0]
    order = sorted(names, key=lambda n: -abs(first[n] - last[n]))[:top]
    for n in order:
        cols = " | ".join(f"{c[n] / rate * 1e3:18.1f}" for c, _ in counts)
        lines.append(f"{cols} | {(first[n] - last[n]) / rate * 1e3:8.1f} | {n}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="py-spy raw outputs; the first and the last are compared")
    p.add_argument("--within", default="run_busy_loop",
                   help="count only stacks through this function ('' for all)")
    p.add_argument("--rate", type=float, default=50.0, help="py-spy's sampling rate (Hz)")
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args(argv)
    print(compare(a.files, a.within or None, a.rate, a.top))


if __name__ == "__main__":
    main()
