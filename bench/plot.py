"""The suite's plot, drawn from its JSON document alone (so a saved run can
be redrawn: `bookstream bench plot results.json`).

Three panels: appends/s per entry size (bookstream, JetStream and the
ceilings); the open-loop latency CDF of both systems and of the floors, with
the targets; and every figure's ratio to its tightest ceiling and to
JetStream.
"""
from __future__ import annotations

from pathlib import Path

COLORS = {"bookstream": "#1f77b4", "jetstream": "#2ca02c", "grpc": "#ff7f0e", "disk": "#7f7f7f", "cpu": "#d62728",
          "grpc_journal": "#9467bd"}


def _appends_panel(ax, doc: dict) -> None:
    figs = [f for f in doc["figures"] if f["key"].startswith("appends_")]
    series = {"bookstream": [f["value"] for f in figs],
              "jetstream": [f["jetstream"]["value"] if f["jetstream"] else 0 for f in figs],
              "gRPC ceiling": [f["ceilings"].get("grpc", {}).get("value") or 0 for f in figs],
              "disk ceiling": [f["ceilings"].get("disk", {}).get("value") or 0 for f in figs],
              "CPU ceiling": [f["ceilings"].get("cpu", {}).get("value") or 0 for f in figs],
              "gRPC + journal floor": [f["ceilings"].get("grpc_journal", {}).get("value") or 0 for f in figs]}
    colors = [COLORS["bookstream"], COLORS["jetstream"], COLORS["grpc"], COLORS["disk"], COLORS["cpu"],
              COLORS["grpc_journal"]]
    width = 0.13
    xs = range(len(figs))
    for i, ((name, vals), color) in enumerate(zip(series.items(), colors)):
        bars = ax.bar([x + (i - 2.5) * width for x in xs], vals, width, label=name, color=color)
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v else "" for v in vals], fontsize=6, rotation=90, padding=2)
    ax.set_xticks(list(xs), [_size(f["entry_bytes"]) for f in figs])
    ax.set_yscale("log")
    ax.set_ylabel("appends/s")
    ax.set_title("Closed-loop appends/s (E3 Qw3 Qa2 vs JetStream R3)")
    ax.legend(fontsize=7)


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def _cdf_panel(ax, doc: dict) -> None:
    runs = [("bookstream", (doc.get("bookstream") or {}).get("open_loop")),
            ("jetstream", ((doc.get("jetstream") or {}).get("open_loop") or [None])[0]),
            ("grpc", ((doc.get("ceilings") or {}).get("grpc") or {}).get("open_loop")),
            ("grpc_journal", ((doc.get("ceilings") or {}).get("grpc_journal") or {}).get("open_loop"))]
    names = {"grpc": "floor: gRPC", "grpc_journal": "floor: gRPC + journal"}
    for name, r in runs:
        if r and r.get("cdf_ms"):
            qs = [q for q, _ in r["cdf_ms"]]
            ms = [max(v, 1e-3) for _, v in r["cdf_ms"]]
            ax.step(ms, qs, where="post", color=COLORS[name], linestyle="--" if name in names else "-",
                    label=f"{names.get(name, name)} (p50 {r['p50_ms']:.2f}, p99.9 {r['p999_ms']:.1f} ms)")
    for key, q in (("open_loop_p50", 0.5), ("open_loop_p99", 0.99), ("open_loop_p999", 0.999)):
        t = (doc.get("targets") or {}).get(key)
        if t:
            ax.plot([t["value"]], [q], marker="x", color="red", linestyle="none")
    ax.plot([], [], marker="x", color="red", linestyle="none", label="targets")
    ax.set_xscale("log")
    ax.set_xlabel("latency, ms (from the scheduled send to the ack)")
    ax.set_ylabel("fraction of appends")
    ol = (doc.get("bookstream") or {}).get("open_loop")
    ax.set_title(f"Open-loop latency CDF, {ol['entry_bytes']} B at {ol['offered_per_s']:,.0f}/s offered"
                 if ol else "Open-loop latency CDF")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)


def _ratio_panel(ax, doc: dict) -> None:
    figs = doc["figures"]
    labels, to_ceiling, to_peer = [], [], []
    from bench.suite import tightest

    for f in figs:
        _, c = tightest(f)
        if c is None and not (f["jetstream"] and f["jetstream"]["ratio"]):
            continue
        labels.append(f["label"])
        to_ceiling.append(c["ratio"] if c else 0)
        to_peer.append(f["jetstream"]["ratio"] if f["jetstream"] and f["jetstream"]["ratio"] else 0)
    ys = range(len(labels))
    ax.barh([y + 0.2 for y in ys], to_ceiling, 0.4, label="÷ ceiling", color=COLORS["grpc"])
    ax.barh([y - 0.2 for y in ys], to_peer, 0.4, label="÷ JetStream", color=COLORS["jetstream"])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(list(ys), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ratio (throughputs: <1 is below; latencies: >1 is slower)")
    ax.set_title("bookstream ÷ ceiling and ÷ JetStream")
    ax.legend(fontsize=7)


def plot(doc: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(20, 6.5))
    _appends_panel(axes[0], doc)
    _cdf_panel(axes[1], doc)
    _ratio_panel(axes[2], doc)
    m = doc.get("machine", {})
    fig.suptitle(f"bookstream bench suite{' (quick)' if doc.get('parameters', {}).get('quick') else ''} — "
                 f"{m.get('cpus')} cores, Linux {m.get('kernel')}, Python {m.get('python')}, {doc.get('started')}",
                 fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
