"""The planner against the emulated cluster: predicted and measured step time of its N best.

Usage (as root; docs/planner.md, "Results")::

    python bench/plan_sweep.py --name hp22 --hosts 2 --ranks-per-host 2 --rate 1gbit \\
        --subnet 10.199.40.0/24 --model deep --run 8 --json docs/results/planner/2x2_1gbit.json

What it does, on one cluster (``bench/cluster.py up``; ``down`` at the end, also on failure):

1. ``python -m collectives.plan --calibrate FILE`` under the cluster's launch: the compute model
   and the links measured on every rank at once (:mod:`collectives.plan.calibrate`);
2. the planner's listing from that file (``--compute-cache FILE --emulated``), printed;
3. each of the ``--run`` best configurations run with the SGD driver on the cluster
   (``--epochs``, ``--subset``) with ``--log``, ``--repeats`` launches each in rounds: the median
   of the launches' median step times, the last launch's per-axis seconds per step and each
   stage's bubble beside the prediction's terms.

4. the calibration again after the runs, and each prediction from it (``predicted after``): how
   far the shared machine drifted while the sweep ran.

``python bench/plan_sweep.py terms FILE.json ...`` prints each sweep's terms predicted against
the driver's report (:func:`terms`); ``forms FILE.json ...`` each run's prediction with the
residual ``s`` of its data-parallel form and with the mesh's dense ``s`` (:func:`forms`).

It prints the table predicted against measured (ratio measured / predicted; ``yes`` where the
prediction is within 25 %) and whether the planner's first choice is within 10 % of the fastest
measured configuration, and writes all of it to ``--json`` (with the load average at the start,
at each launch and at the end: the machine is shared). The calibration's ``"partners"``
(:mod:`collectives.plan.partners`) holds each mesh's measured partner waits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from collectives.parallel import planner  # noqa: E402
from collectives.plan import measure  # noqa: E402
from collectives.sgd import datasets  # noqa: E402
from collectives.sgd.model import MODELS  # noqa: E402

CLUSTER = [sys.executable, str(HERE / "cluster.py")]
TOLERANCE = 0.25
FIRST_CHOICE = 0.10


def _cluster_run(name: str, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([*CLUSTER, "run", "--name", name, "--", *argv], capture_output=True,
                          text=True, timeout=timeout)


def terms(path: Path) -> str:
    """A Markdown table of a sweep's ``--json``: each configuration's terms predicted against
    the driver's report. The driver's are its means per step over the launch (the first step
    and the evaluation's tp allreduces included), scaled by median step / mean step so that
    they add up to the median step the prediction is compared with; "wait" is the driver's
    idle time (the measured bubble with the hand-offs) against the predicted bubble + pp; the
    driver residual ``s`` is predicted only (the driver's compute holds what it stands for)."""
    data = json.loads(path.read_text())
    rows = ["| # | configuration | step pred / meas | compute pred / meas | tp pred / meas | "
            "bubble + pp pred / meas wait | dp pred / meas | s pred | measured / predicted |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in data["runs"]:
        if "measured" not in r:
            continue
        p, m = r["predicted"], r["measured"]
        sec, axes = m["seconds"], m["axes"]
        k = m["step"] / sec["step"] if sec.get("step") else 1.0
        tp, dp = axes.get("tp", 0.0) * k, axes.get("dp", 0.0) * k
        wait = sec.get("bubble", 0.0) * k
        comp = m["step"] - tp - dp - wait

        def ms(a: float, b: float) -> str:
            return f"{a * 1e3:.0f} / {b * 1e3:.0f}"

        rows.append(f"| {r['rank']} | {r['config']} | {ms(p['step'], m['step'])} | "
                    f"{ms(p['compute'], comp)} | {ms(p['tp'], tp)} | "
                    f"{ms(p['bubble'] + p['pp'], wait)} | {ms(p['dp'], dp)} | "
                    f"{p.get('driver', 0.0) * 1e3:.0f} | {m['step'] / p['step']:.2f} |")
    return "\n".join(rows)


def forms(path: Path) -> str:
    """A sweep's runs with the residual ``s`` of their data-parallel form (ZeRO 1, a codec:
    the calibration's ``"forms"``) against the same prediction with the mesh's dense ``s``
    (one ``s`` per mesh, the model before): measured / predicted of each, how many within
    25 %, and the first choice's gap to the fastest measured (the dense-``s`` model's first
    choice among the runs is the one it prices lowest)."""
    data = json.loads(path.read_text())
    partners = data["calibration"].get("partners", {})
    rows = ["| # | configuration | measured ms | predicted ms (s of its form) | ratio | "
            "predicted ms (dense s) | ratio |", "|---|---|---|---|---|---|---|"]
    ok = [r for r in data["runs"] if "measured" in r]
    dense = {}
    for r in ok:
        f = r["config"].split()
        mesh = f"{f[1]},{f[3]},{f[5]}"
        p = r["predicted"]
        dense[r["rank"]] = p["step"] - p.get("driver", 0.0) + \
            float((partners.get(mesh) or {}).get("driver", 0.0))
        m = r["measured"]["step"]
        rows.append(f"| {r['rank']} | {r['config']} | {m * 1e3:.0f} | {p['step'] * 1e3:.0f} | "
                    f"{m / p['step']:.2f} | {dense[r['rank']] * 1e3:.0f} | "
                    f"{m / dense[r['rank']]:.2f} |")
    if not ok:
        return "\n".join(rows)
    fastest = min(r["measured"]["step"] for r in ok)
    within = [sum(abs(r["measured"]["step"] / q - 1) <= TOLERANCE for r, q in zip(ok, qs))
              for qs in ([r["predicted"]["step"] for r in ok], [dense[r["rank"]] for r in ok])]
    firsts = [ok[0], min(ok, key=lambda r: dense[r["rank"]])]
    rows.append("")
    for name, n, first in zip(("s of its form", "dense s"), within, firsts):
        rows.append(f"{name}: {n} of {len(ok)} within 25 %; first choice among the runs "
                    f"#{first['rank']}, {100 * (first['measured']['step'] / fastest - 1):.1f} % "
                    f"above the fastest measured")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] in ("terms", "forms"):  # plan_sweep.py terms|forms FILE.json ...
        show = terms if argv[0] == "terms" else forms
        for f in argv[1:]:
            print(f"{f}\n\n{show(Path(f))}\n")
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", required=True)
    p.add_argument("--hosts", type=int, required=True)
    p.add_argument("--ranks-per-host", type=int, required=True)
    p.add_argument("--rate", required=True)
    p.add_argument("--subnet", required=True)
    p.add_argument("--model", default="deep", choices=list(MODELS))
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--codecs", default="none,fp16")
    p.add_argument("--micro-factors", default="1,2,4")
    p.add_argument("--run", type=int, default=6)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1,
                   help="launches of each configuration, in rounds (1..N, 1..N, ...); measured "
                        "is the median of their median steps")
    p.add_argument("--subset", type=int)
    p.add_argument("--json", type=Path)
    p.add_argument("--keep", action="store_true", help="leave the cluster up")
    a = p.parse_args(argv)
    ranks = a.hosts * a.ranks_per_host
    py = sys.executable
    plan_args = ["--model", a.model, "--ranks", str(ranks), "--hosts", str(a.hosts),
                 "--network", a.rate, "--batch-size", str(a.batch_size), "--micro-factors",
                 a.micro_factors]
    up = [*CLUSTER, "up", "--name", a.name, "--hosts", str(a.hosts), "--ranks-per-host",
          str(a.ranks_per_host), "--rate", a.rate, "--subnet", a.subnet]
    subprocess.run(up, check=True)
    out: dict = {"cluster": {"hosts": a.hosts, "ranks_per_host": a.ranks_per_host,
                             "rate": a.rate}, "model": a.model, "runs": [],
                 "load": {"start": os.getloadavg()}}
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="plan-sweep-") as tmp:
            cal = Path(tmp) / "calibration.json"
            done = _cluster_run(a.name, [py, "-m", "collectives.plan", *plan_args, "--codecs",
                                         a.codecs, "--calibrate", str(cal)], 900)
            print(done.stdout.strip(), done.stderr.strip()[-2000:], sep="\n", flush=True)
            if done.returncode:
                return done.returncode
            out["calibration"] = json.loads(cal.read_text())
            listing = subprocess.run(
                [py, "-m", "collectives.plan", *plan_args, "--emulated", "--codecs", a.codecs,
                 "--compute-cache", str(cal)], capture_output=True, text=True, check=True)
            print(listing.stdout, flush=True)
            out["listing"] = listing.stdout
            ds = datasets.load("digits")
            hidden = MODELS[a.model]
            w = planner.Workload((ds.features, *hidden, ds.classes), a.batch_size * ranks)
            cl = planner.cluster(ranks, a.hosts, a.rate)
            compute = planner.MeasuredCompute(cal)
            cl = planner.cluster(ranks, a.hosts, a.rate, None, compute.network)
            codecs = tuple(s for s in a.codecs.split(",") if s)
            factors = tuple(int(f) for f in a.micro_factors.split(","))
            rows = planner.plan(w, cl, compute, codecs, factors)[:a.run]
            launches: dict[int, list[float]] = {}
            by_rank: dict[int, dict] = {}
            for i, pr in [(i, pr) for _ in range(a.repeats) for i, pr in enumerate(rows, 1)]:
                c = pr.config
                cmd = measure.command(c, w, a.model, hidden, "digits", a.batch_size, cl,
                                      a.epochs)
                drv = cmd[cmd.index("python") + 1:]
                drv = [x for x in drv if x != "--quiet"]
                log = Path(tmp) / f"run{i}.json"
                extra = ["--subset", str(a.subset)] if a.subset else []
                done = _cluster_run(a.name, [py, *drv, *extra, "--quiet", "--log", str(log)],
                                    1200)
                name = (f"dp {c.dp} pp {c.pp} tp {c.tp} M {c.micro_batches} shard {c.shard} "
                        f"codec {c.codec}")
                rec = {"rank": i, "config": name, "command": measure.shell(drv),
                       "load": os.getloadavg(),
                       "predicted": {k: getattr(pr, k) for k in
                                     ("step", "compute", "bubble", "dp", "pp", "tp", "driver")},
                       "stages": pr.stages}
                if done.returncode or not log.exists():
                    rec["error"] = (done.stderr or done.stdout).strip()[-500:]
                    print(f"#{i} {name}: failed: {rec['error']}", flush=True)
                else:
                    s = json.loads(log.read_text())["summary"]
                    steps = max(1, int(s["steps"]))
                    rec["measured"] = {"step": s["step_median_s"], "steps": steps,
                                       "seconds": {k: v / steps for k, v in
                                                   s["seconds"].items()},
                                       "axes": {k: v["seconds"] / steps
                                                for k, v in (s.get("axes") or {}).items()},
                                       "bubble": [st["bubble"] for st in
                                                  (s.get("pipeline") or {}).get("per_stage", [])],
                                       "stage_layers": [st["layers"] for st in
                                                        (s.get("pipeline") or {})
                                                        .get("per_stage", [])]}
                    launches.setdefault(i, []).append(rec["measured"]["step"])
                    rec["measured"]["launches"] = list(launches[i])
                    rec["measured"]["step"] = statistics.median(launches[i])
                    m = rec["measured"]["step"]
                    print(f"#{i} {name}: predicted {pr.step * 1e3:.0f} ms, measured "
                          f"{m * 1e3:.0f} ms, ratio {m / pr.step:.2f} (load average "
                          f"{rec['load'][0]:.2f})", flush=True)
                if "measured" in rec or i not in by_rank:
                    by_rank[i] = rec
            out["runs"] = [by_rank[i] for i in sorted(by_rank)]
            # the same calibration again after the runs: how far the machine drifted
            cal2 = Path(tmp) / "calibration-after.json"
            done = _cluster_run(a.name, [py, "-m", "collectives.plan", *plan_args, "--codecs",
                                         a.codecs, "--calibrate", str(cal2)], 900)
            print(done.stdout.strip(), flush=True)
            if cal2.exists():
                out["calibration_after"] = json.loads(cal2.read_text())
                after = planner.MeasuredCompute(cal2)
                cl2 = planner.cluster(ranks, a.hosts, a.rate, None, after.network)
                for rec, pr in zip(out["runs"], rows):
                    rec["predicted_after"] = planner.predict(pr.config, w, cl2, after).step
    finally:
        if not a.keep:
            subprocess.run([*CLUSTER, "down", "--name", a.name])
    out["load"]["end"] = os.getloadavg()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    ok = [r for r in out["runs"] if "measured" in r]
    print("\n| # | configuration | predicted ms | measured ms | measured / predicted | "
          "within 25 % | predicted after ms |")
    print("|---|---|---|---|---|---|---|")
    for r in ok:
        ratio = r["measured"]["step"] / r["predicted"]["step"]
        r["ratio"] = ratio
        after = f"{r['predicted_after'] * 1e3:.0f}" if "predicted_after" in r else "-"
        print(f"| {r['rank']} | {r['config']} | {r['predicted']['step'] * 1e3:.0f} | "
              f"{r['measured']['step'] * 1e3:.0f} | {ratio:.2f} | "
              f"{'yes' if abs(ratio - 1) <= TOLERANCE else 'no'} | {after} |")
    if ok:
        fastest = min(ok, key=lambda r: r["measured"]["step"])
        first = ok[0]
        gap = first["measured"]["step"] / fastest["measured"]["step"] - 1
        out["first_choice_gap"] = gap
        print(f"\nfirst choice #{first['rank']} measured {first['measured']['step'] * 1e3:.0f} ms;"
              f" fastest measured #{fastest['rank']} {fastest['measured']['step'] * 1e3:.0f} ms: "
              f"{100 * gap:.1f} % slower ({'within' if gap <= FIRST_CHOICE else 'not within'} "
              f"10 %)")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
