# one-off device probe of the fourteenth stop, on d26696f with state_vk.patch (beside this file) applied: git apply profiling/results/2026-12-02/s14_vk/state_vk.patch; then from the project root:
# python3 profiling/results/2026-12-02/s14_vk/probe_vk.py [--fi]): the sequential kernel with the
# state as S [bv, K] (ChunkConfig.state_vk) against S^T per shape and TP, each config's bits
# against the default, intra and seq timed apart; the intra kernel with parts of its inverse cut
# (wrong results, timing only: where intra's time goes); with --fi FlashInfer's columns of
# bench_prefill in the same run.
import importlib.util, json, os, sys, tempfile, torch, triton
sys.path.insert(0, "profiling")
import bench_prefill as bp
from gdn_graphs.ops import chunk as C
from gdn_graphs.ops.chunk import ChunkConfig, chunk_intra_fwd, chunk_seq_fwd, gdn_chunk_prefill
CPU = "--cpu" in sys.argv  # a dry run of every path under the interpreter, tiny shapes
if CPU:
    bp._dry_run_setup()
    bp.bench_ms = lambda triton, fn, quick: (fn(), 1.0)[1]
else:
    bp.DEVICE = "cuda"
sync = (lambda: None) if CPU else torch.cuda.synchronize
torch.set_grad_enabled(False)
OUT = os.environ.get("OUT", "/tmp")
CFGS = [dict(bv=32), dict(bv=64), dict(bv=64, warps_seq=8, stages=2, state_vk=True),
        dict(bv=64, warps_seq=8, stages=3, state_vk=True), dict(bv=128, warps_seq=8, stages=2, state_vk=True),
        dict(bv=32, stages=3, state_vk=True), dict(bv=64, warps_seq=4, stages=2, state_vk=True)]
SHAPES = [(1, 192), (2, 64)] if CPU else [(1, 8192), (8, 2048), (4, 16384)]
if CPU:
    CFGS = [dict(bv=16), dict(bv=32), dict(bv=16, state_vk=True), dict(bv=32, warps_seq=8, stages=2, state_vk=True)]

# intra variants: the source of chunk.py with parts of the inverse removed
src = open(C.__file__).read()
CUTS = {"no_rowsteps": [("for rr in range(2, 16):", "for rr in range(2, 2):")],
        "no_sweeps": [("for _ in tl.static_range(3):", "for _ in tl.static_range(0):")],
        "no_inverse": [("for rr in range(2, 16):", "for rr in range(2, 2):"),
                       ("for _ in tl.static_range(3):", "for _ in tl.static_range(0):")]}
variants = {}
tmpd = tempfile.mkdtemp()
for name, subs in CUTS.items():
    s = src
    for a, b in subs:
        assert s.count(a) == 1, (name, a)
        s = s.replace(a, b)
    path = os.path.join(tmpd, f"chunk_{name}.py")
    open(path, "w").write(s)
    spec = importlib.util.spec_from_file_location(f"chunk_{name}", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    variants[name] = m

rows = []
def emit(r):
    rows.append(r)
    print(json.dumps(r), flush=True)

for tp in (1, 2):
    bp.set_tp(tp)
    for nseq, L in SHAPES:
        case = bp.Case(torch, nseq, L)
        meta = case.metas["B=256"]
        shape = f"{nseq}x{L}"
        ref = None
        for kw in CFGS:
            cfg = ChunkConfig(**kw)
            pool0 = case.pool.clone()
            f = lambda: gdn_chunk_prefill(*case.args(), meta, out=case.out, workspace=case.ws, config=cfg)
            try:
                case.pool.zero_(); f(); sync()
            except Exception as e:  # noqa: BLE001
                emit(dict(tp=tp, shape=shape, cfg=kw, error=str(e)[:300])); continue
            out, pool = case.out.clone(), case.pool.clone()
            if ref is None:
                ref = (out, pool)
            same = bool(torch.equal(out, ref[0]) and torch.equal(pool, ref[1]))
            diff = float((out.float() - ref[0].float()).norm() / ref[0].float().norm())
            ms = bp.bench_ms(triton, f, True)
            ms_seq = bp.bench_ms(triton, lambda: chunk_seq_fwd(
                case.out, case.v, case.pool, case.ws, meta, case.HK, bv=cfg.bv, num_warps=cfg.warps_seq,
                num_stages=cfg.stages_for(torch.bfloat16), dot_precision="tf32", state_vk=cfg.state_vk), True)
            emit(dict(tp=tp, shape=shape, cfg=kw, ms=ms, Mtok_s=case.T / ms / 1e3, ms_seq=ms_seq,
                      bits_equal_default=same, rel_diff_default=diff))
            del out, pool
        for name, mod in [("intra", C)] + list(variants.items()):
            g = lambda mod=mod: mod.chunk_intra_fwd(case.q, case.k, case.a, case.b, case.A_log, case.dt_bias,
                                                    case.out, case.ws, meta, bp.K ** -0.5, dot_precision="tf32",
                                                    inv_precision="tf32")
            ck = g()
            emit(dict(tp=tp, shape=shape, intra=name, ms=bp.bench_ms(triton, g, True),
                      regs=getattr(ck, "n_regs", None), spills=getattr(ck, "n_spills", None)))
        if "--fi" in sys.argv:
            fi, why = bp.load_fi()
            if fi is not None:
                r = bp.bench_fi(torch, triton, fi, case, True, bp.ours_reference(torch, case))
                emit(dict(tp=tp, shape=shape, fi={k: (dict((a, b) for a, b in v.items() if a in ("ms", "Mtok_s", "path", "error"))
                                                      if isinstance(v, dict) else v) for k, v in r.items()}))
            else:
                emit(dict(tp=tp, shape=shape, fi_error=str(why)[:300]))
        del case
        if not CPU:
            torch.cuda.empty_cache()
json.dump(rows, open(os.path.join(OUT, "probe_vk.json"), "w"), indent=1)
print("\n== summary (M tok/s, a state every 256; seq ms; = bits equal the default)")
for r in rows:
    if "cfg" in r and "ms" in r:
        c = r["cfg"]
        print(f"tp{r['tp']} {r['shape']:>8} {'vk' if c.get('state_vk') else 'kv'} bv{c['bv']}/w{c.get('warps_seq', 4)}/"
              f"st{c.get('stages', 3)}: {r['Mtok_s']:6.2f}  seq {r['ms_seq']:.3f} ms  {'=' if r['bits_equal_default'] else 'diff %.1e' % r['rel_diff_default']}")
    elif "intra" in r:
        print(f"tp{r['tp']} {r['shape']:>8} intra {r['intra']:>12}: {r['ms']:.3f} ms  regs {r['regs']} spills {r['spills']}")
    elif "fi" in r:
        f = r["fi"]
        print(f"tp{r['tp']} {r['shape']:>8} FI: " + "  ".join(f"{k} {v.get('Mtok_s', float('nan')):.2f}" for k, v in f.items()
                                                         if isinstance(v, dict) and "Mtok_s" in v))
