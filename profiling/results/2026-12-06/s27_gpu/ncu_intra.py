"""Nsight Compute's view of the two chunk-parallel kernels and the Gluon sequential kernel at TP-1
8 x 2048 (twenty-seventh stop, call 5): one launch each after a warm-up, profiled by
`call.sh 5` with `ncu --set full` (where the time goes: stall reasons, occupancy, memory)."""

import torch

from gdn_graphs.ops.chunk import chunk_intra_fwd, chunk_seq_fwd_by
from gdn_graphs.ops.chunk_intra_gluon import chunk_intra_fwd_gluon
from gdn_graphs.ops.workspace import GLUON_CONFIG
import sys, os
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_gluon_intra import case, K  # noqa: E402

c = case(8, 2048, 16, 32)
from gdn_graphs.ops.workspace import ChunkWorkspace  # noqa: E402
ws = ChunkWorkspace(c["T"], 32, K, K, torch.bfloat16, "cuda", HK=16)
out = torch.empty(c["T"], 32, K, device="cuda", dtype=torch.bfloat16)
args = (c["q"], c["k"], c["a"], c["b"], c["A_log"], c["dt_bias"], out)
for _ in range(2):  # compile, warm
    chunk_intra_fwd(*args, ws, c["meta"], K ** -0.5, num_warps=4, dot_precision="tf32", inv_precision="tf32")
    chunk_intra_fwd_gluon(*args, ws, c["meta"], K ** -0.5)
    chunk_seq_fwd_by(GLUON_CONFIG, out, c["v"], c["pool"], ws, c["meta"], 16)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
chunk_intra_fwd(*args, ws, c["meta"], K ** -0.5, num_warps=4, dot_precision="tf32", inv_precision="tf32")
chunk_intra_fwd_gluon(*args, ws, c["meta"], K ** -0.5)
chunk_seq_fwd_by(GLUON_CONFIG, out, c["v"], c["pool"], ws, c["meta"], 16)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
