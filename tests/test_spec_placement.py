"""The spec rows' placement from device counts (``gdn_graphs.vllm.spec_placement``, vLLM's async
scheduling): the kernel's placeholders equal the host planner's lookahead placement for the true
counts (``lookahead_row_slots``), whatever the host's own counts were; bad counts and columns
give NO_SLOT and the error flag; bad arguments raise before anything runs (CPU tier: Triton
interpreter)."""

import numpy as np
import pytest
import torch

from gdn_graphs.constants import NO_SLOT
from gdn_graphs.ops.common import ERR_META, ERR_TOKENS
from gdn_graphs.runtime.step import lookahead_row_slots
from gdn_graphs.vllm.slots import DeviceTablePlanner
from gdn_graphs.vllm.spec_placement import place_spec_rows

B = 64


@pytest.mark.parametrize("k, seed", [(1, 0), (3, 1), (7, 2)])
def test_device_placement_equals_host_placement_of_true_counts(k, seed):
    """Host plans with optimistic counts (the true count + up to k rejected drafts); the device
    counts place the spec rows exactly as a host plan of the true counts would; padded rows and
    the prefill row keep the host plan."""
    _check_placement(k, seed, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("k, seed", [(1, 0), (3, 1), (7, 2)])
def test_gpu_device_placement_equals_host_placement_of_true_counts(k, seed, gpu):
    """The same with the kernel compiled for the GPU (the interpreter accepts kernels that do not
    compile: tests/test_kernel_globals.py)."""
    _check_placement(k, seed, gpu)


def _check_placement(k, seed, device):
    rng = np.random.default_rng(seed)
    L, R, width, rows = k + 1, k + 1, 12 + k + 1, 4
    p = DeviceTablePlanner(8, 512, B, None, width, null_block=0, device=device,
                           max_spec_len=L, lookahead=R)
    table = torch.arange(1, 1 + 8 * width, dtype=torch.int32, device=device).view(8, width)
    exact = DeviceTablePlanner(8, 512, B, None, width, null_block=0, device=device,
                               max_spec_len=L, lookahead=R)
    for trial in range(40):
        q = rng.integers(1, L + 1, rows)
        if trial % 4 == 0:
            q[:] = L  # one length: the step is padded to a graph's rows
        n_true = rng.integers(0, 10 * B, rows)
        n_true[trial % rows] = rng.choice([0, B, 2 * B - 1, 3 * B - k])  # edges
        n_host = n_true + rng.integers(0, k + 1, rows) * (n_true > 0)
        prefill = trial % 3 == 1
        qs = list(q) + ([100] if prefill else [])
        nh = list(n_host) + ([3 * B] if prefill else [])
        nt = list(n_true) + ([3 * B] if prefill else [])
        qsl = np.concatenate([[0], np.cumsum(qs)])
        dev = torch.tensor(np.add(nt, qs), dtype=torch.int32, device=device)
        pad = 6
        got = p.plan(qsl, nh, table, pad_decodes_to=pad, spec_rows=rows, device_seq_lens=dev)
        want = exact.plan(qsl, nt, table, pad_decodes_to=pad, spec_rows=rows)
        assert got.num_spec == want.num_spec and got.spec_len == want.spec_len
        assert torch.equal(got.spec_read, want.spec_read), trial
        assert torch.equal(got.spec_write, want.spec_write), trial
        assert torch.equal(p.slots.flat, exact.slots.flat), trial  # prefill and padding too
        for i in range(rows):  # and against the one-row reference
            r, w, ck = lookahead_row_slots(i, int(n_true[i]), int(q[i]), table[i].tolist(), B, R,
                                           True)
            assert int(got.spec_read[i]) == r
            assert got.spec_write[i, :q[i]].tolist() == [*ck, w]
            assert (got.spec_write[i, q[i]:] == NO_SLOT).all()
        assert int(p.planner.error_flag[0]) == 0


def test_bad_counts_and_columns_give_no_slot_and_the_flag():
    k, L, R = 3, 4, 5
    S = 4
    read = torch.full((S,), 7, dtype=torch.int32)
    write = torch.full((S, L), 7, dtype=torch.int32)
    cu = torch.tensor([0, 4, 8, 9, 13], dtype=torch.int32)
    flag = torch.zeros(1, dtype=torch.int32)
    # row 0: n = -1 (a count that cannot be); row 1: n = 0; row 2: n = 60, q = 1 -> column 2
    seq = torch.tensor([3, 4, 61, 0], dtype=torch.int32)
    place_spec_rows(seq, cu, read, write, 3, stride=100, width=8, block_size=B, lookahead=R,
                    error_flag=flag)
    assert read[:3].tolist() == [NO_SLOT, NO_SLOT, 100 * 2 + 0 + 1 + (60 - 0) % R]
    assert (write[0] == NO_SLOT).all()
    assert write[1].tolist() == [100 + 0 + 1 + (m - 0) % R for m in range(1, 5)]
    # the state after 61 tokens: column 0 + 1 + 61 % 5 = 2, then nothing
    assert write[2].tolist() == [200 + 2, NO_SLOT, NO_SLOT, NO_SLOT]
    assert int(flag[0]) == ERR_TOKENS
    assert read[3] == 7 and (write[3] == 7).all()  # rows past ``rows`` untouched
    flag.zero_()
    seq = torch.tensor([4 + 62, 4, 1, 0], dtype=torch.int32)  # row 0 at 62: 63, 64, 65, 66
    place_spec_rows(seq, cu, read, write, 1, stride=100, width=3, block_size=B, lookahead=R,
                    error_flag=flag)
    # 62 -> column 0 + 1 + 62 % 5 = 3 >= width 3: NO_SLOT; 63 -> 4 (out), 64 -> block 0,
    # 65 -> 1 + 1 + 64 % 5 = 6 (out), 66 -> 2 + 65 % 5 = 2 (c = 1: the residue of m - c)
    assert int(read[0]) == NO_SLOT and write[0].tolist() == [NO_SLOT, 0, NO_SLOT, 2]
    assert int(flag[0]) == ERR_META


def test_bad_arguments_raise_before_a_launch():
    read = torch.zeros(4, dtype=torch.int32)
    write = torch.zeros(4, 4, dtype=torch.int32)
    cu = torch.zeros(5, dtype=torch.int32)
    seq = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="seq_lens must be a 1-d int32"):
        place_spec_rows(seq.long(), cu, read, write, 1, 10, 10, B, 5)
    with pytest.raises(ValueError, match="rows=5 exceeds"):
        place_spec_rows(seq, cu, read, write, 5, 10, 10, B, 5)
    with pytest.raises(ValueError, match="lookahead 3 must be at least"):
        place_spec_rows(seq, cu, read, write, 1, 10, 10, B, 3)
    p = DeviceTablePlanner(4, 64, B, None, 10, device="cpu", max_spec_len=4, lookahead=5)
    table = torch.zeros(4, 10, dtype=torch.int32)
    with pytest.raises(ValueError, match="device_seq_lens must be an int32"):
        p.plan(np.array([0, 4]), [10], table, spec_rows=1,
               device_seq_lens=torch.zeros(1, dtype=torch.int64))


_COMPILE_SCRIPT = r"""
from gdn_graphs.vllm import spec_placement as S
from sm90_compile import compile_sm90, ptxas_report

meta = {"seq_lens", "spec_cu", "spec_read", "spec_write", "error_flag"}
for L, has_flag in [(2, True), (4, True), (4, False), (8, True)]:
    ck = compile_sm90(S._place_spec_rows_kernel, dict(L=L, BLOCK_L=L), {}, meta,
                      ("stride", "width", "B", "R"), has_flag, num_warps=1)
    regs, spills = ptxas_report(ck)
    print(L, has_flag, "regs", regs, "spills", spills)
    assert ("atom" in ck.asm["ptx"]) == has_flag, "the flag's atomic"
"""


def test_placement_kernel_compiles_for_sm90():
    """The placement kernel compiles for an H200 (sm_90) without the interpreter, with and
    without the error flag (its first GPU run failed at compile time; the CPU tier had passed).
    Needs no GPU (Triton's ptxas)."""
    import os

    from sm90_compile import ptxas_path, run_script
    if not os.path.exists(ptxas_path()):
        pytest.skip("this triton has no bundled ptxas")
    res = run_script(_COMPILE_SCRIPT)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
