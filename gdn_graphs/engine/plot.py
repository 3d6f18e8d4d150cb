"""A step of a torch.profiler Chrome trace drawn on a time axis (matplotlib, the ``profile`` extra):
one lane per stream (GPU kernels) or thread (CPU operators), the longest kernels in the legend."""

from __future__ import annotations

__all__ = ["plot_step"]


def plot_step(events: list[dict], step_name: str, png_path, title: str) -> int:
    """Draw one step of a Chrome trace's events: the GPU kernels launched inside the step's CPU
    range (paired with their launches by correlation id) if there are any, else the CPU operators
    (or interpreted kernels) inside that range. Returns how many events it drew."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans = [e for e in events if e.get("ph") == "X"]
    cpu_win = [e for e in spans if e.get("cat") == "user_annotation" and e["name"] == step_name]
    # GPU kernels launched inside the step's CPU range (CUPTI's correlation ids pair them)
    from gdn_graphs.engine.profile import kernel_launches

    w = cpu_win[0] if cpu_win else None
    sel = [] if w is None else [k for k, call in kernel_launches(spans) if call.get("tid") == w["tid"]
                                and w["ts"] <= call["ts"] <= w["ts"] + w["dur"]]
    if sel:
        t_first = min(k["ts"] for k in sel)
        w = {"ts": t_first, "dur": max(k["ts"] + k["dur"] for k in sel) - t_first}
        lane_of = lambda e: f"stream {e.get('args', {}).get('stream', e.get('tid'))}"
        what = "GPU kernels"
    elif cpu_win:
        w = cpu_win[0]
        tid = w["tid"]
        within = [e for e in spans if e.get("tid") == tid and w["ts"] <= e["ts"]
                  and e["ts"] + e["dur"] <= w["ts"] + w["dur"]]
        # under the Triton interpreter the kernels are recorded as ranges "kernel:<name>"
        inside = [e for e in within if e["name"].startswith("kernel:")] or [
            e for e in within if e.get("cat") == "cpu_op"]
        # top-level operators only (not nested in another selected operator)
        inside.sort(key=lambda e: (e["ts"], -e["dur"]))
        sel, end = [], -1.0
        for e in inside:
            if e["ts"] >= end:
                sel.append(e)
                end = e["ts"] + e["dur"]
        lane_of = lambda e: f"thread {e.get('tid')}"
        what = "CPU operators"
    else:
        raise RuntimeError(f"{step_name} not found in the trace")
    t0 = w["ts"]
    lanes = sorted({lane_of(e) for e in sel})
    fig, ax = plt.subplots(figsize=(14, 1.6 + 0.5 * len(lanes)))
    cmap = plt.get_cmap("turbo")
    names = sorted({e["name"] for e in sel})
    color = {n: cmap((i + 0.5) / len(names)) for i, n in enumerate(names)}
    for e in sel:
        y = lanes.index(lane_of(e))
        ax.broken_barh([((e["ts"] - t0) / 1e3, max(e["dur"], 0.3) / 1e3)], (y - 0.4, 0.8),
                       facecolors=color[e["name"]], edgecolors="none")
    busy = sum(e["dur"] for e in sel)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_xlabel("ms since the step began")
    ax.set_title(f"{title}: {len(sel)} {what}, busy {busy / 1e3:.3f} ms of {w['dur'] / 1e3:.3f} ms")
    top = sorted(names, key=lambda n: -sum(e["dur"] for e in sel if e["name"] == n))[:8]
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=color[n]) for n in top],
              labels=[n[:60] for n in top], fontsize=7, loc="upper right", ncol=2)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return len(sel)
