"""Static SASS instruction counts of the Gluon intra kernel per phase (CPU only: Triton's ptxas and
nvdisasm for sm_90, no GPU): the stamped copy of probe_phases.py is compiled, disassembled, and its
instructions counted between consecutive %clock64 reads (the head loop's phases once: a CTA runs
them once per value head). Compares the twenty-eighth stop's kernel (5ce061a) with the
library's and the probe's variants.

    PYTHONPATH=. python3 profiling/results/2026-12-06/s29_gpu/sass_phases.py
"""

import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, "tests")
sys.path.insert(0, os.path.dirname(__file__))
import probe_phases as P  # noqa: E402
from sm90_compile import compile_sm90, ptxas_path  # noqa: E402

PHASES = ["(entry)", "load, norm, store", "K K^T, Q K^T"] + P.INTRA_PHASES + ["(end)", "(exit)"]


def counts(src, tag):
    mod = P.load(P.intra_source_text(src), "sass_" + tag)
    k = compile_sm90(mod._intra_gluon_kernel, dict(HK=16, HV=32, K=128, V=128, BC=64),
                     {"A_log": "*fp32", "dt_bias": "*fp32", "g_ws": "*fp32", "stamps": "*i64", "error_flag": "*i32",
                      "scale": "fp32"}, {"cu_seqlens", "start_pos", "chunk_seq", "chunk_idx"},
                     {"T", "max_seqs", "max_chunks"}, False, 4,
                     lambda n, ty: ty.startswith("*") or n in ("s_qt", "s_kt", "s_ot"))  # as the launcher
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    nvdisasm = os.path.join(os.path.dirname(ptxas_path()), "nvdisasm")
    sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    seg, n = 0, collections.Counter()
    for line in sass.splitlines():
        if re.match(r"\s+/\*[0-9a-f]{4}\*/", line):
            seg += "SR_CLOCK" in line
            n[seg] += 1
    return [n[i] for i in range(len(PHASES))]


def main():
    srcs = {"s28": P.s28_source(),
            "lib": open(P.chunk_intra_gluon.__file__).read(),
            **{vn: P.variant_source(e) for vn, e in P.VARIANTS.items()}}
    table = {tag: counts(src, tag.replace("+", "_")) for tag, src in srcs.items()}
    print(f"{'phase':24s}" + "".join(f"{t:>12s}" for t in table))
    for i, ph in enumerate(PHASES):
        print(f"{ph:24s}" + "".join(f"{c[i]:12d}" for c in table.values()))
    print(f"{'a value head':24s}" + "".join(f"{sum(c[3:11]):12d}" for c in table.values()))
    print(f"{'a CTA (HV / HK = 2)':24s}" + "".join(f"{sum(c[1:3]) + 2 * sum(c[3:11]):12d}" for c in table.values()))


if __name__ == "__main__":
    main()
