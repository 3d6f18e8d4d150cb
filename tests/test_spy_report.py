"""profiling/spy_report.py: host time from py-spy's raw stacks, inside the engine loop only."""

from test_vllm_load import _module

RAW_A = """\
process 10:"python3 e2e.py --x a;b";<module> (e2e.py:1);load (e2e.py:9) 500
process 10:"python3 e2e.py";process 11:"python3 -c spawn_main; spawn_main()";EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:900);step (vllm/v1/engine/core.py:300);Scheduler.schedule (vllm/v1/core/sched/scheduler.py:425) 40
process 10:"python3 e2e.py";process 11:"x";EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:900);step (vllm/v1/engine/core.py:300);build (gdn_graphs/vllm/v0_26/model.py:199);build (gdn_graphs/vllm/builder.py:124) 30
"""
RAW_B = """\
process 20:"python3 e2e.py";process 21:"x";EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:900);step (vllm/v1/engine/core.py:300);Scheduler.schedule (vllm/v1/core/sched/scheduler.py:425) 44
"""


def test_spy_report_counts_inside_the_loop_and_ranks_the_difference(tmp_path):
    spy = _module("spy_report")
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(RAW_A)
    b.write_text(RAW_B)
    stacks = spy.read_stacks(str(a), "run_busy_loop")
    assert [n for _, n in stacks] == [40, 30]          # start-up (no loop frame) left out
    inc, total = spy.inclusive(stacks)
    assert total == 70
    assert inc["build (model.py)"] == 30 and inc["build (builder.py)"] == 30
    assert inc["step (core.py)"] == 70                 # once per stack
    assert inc["process"] == 70                        # pids and quoted ";" do not split frames
    text = spy.compare([str(a), str(b)], "run_busy_loop", rate=100.0, top=3).splitlines()
    assert text[0] == "samples inside 'run_busy_loop': 70, 44 (700, 440 ms at 100 Hz)"
    # largest difference first: the builds (300 ms more in a), then the loop itself (260 ms)
    assert text[2].split("|")[-1].strip() in ("build (model.py)", "build (builder.py)")
    assert float(text[2].split("|")[2]) == 300.0
    assert all(spy._is(n, "run_busy_loop") for n in ("EngineCoreProc.run_busy_loop", "run_busy_loop"))
    assert not spy._is("run_busy_loop_x", "run_busy_loop")
