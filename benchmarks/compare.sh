#!/usr/bin/env bash
# Ours against the anchors (../shared/anchors) on identical work, in one invocation:
# a table of ratios (ours / anchor), its last line a one-line summary.
#   bash benchmarks/compare.sh                   # ~6 min ours + ~7 min anchors on 2 cores
#   RUN_ANCHORS=0 bash benchmarks/compare.sh     # anchors from their results.json instead
#   QUICK=1 bash benchmarks/compare.sh           # "test" preset, seconds: behaviour only
#   REUSE=1 OUT=DIR bash benchmarks/compare.sh   # only the table, from DIR's earlier results
#   LONG_TAIL=1 bash benchmarks/compare.sh       # only the long_tail rows, ~7 min on 1 core
#   LONG_TAIL=0 bash benchmarks/compare.sh       # without the long_tail rows
#   LONG_TAIL=1 LONG_TAIL_ANCHORS=hf_continuous_batching bash benchmarks/compare.sh  # one anchor
# long_tail (spec "long_tail", bench-tiny; each row stops at its own seeded length): ours is
# benchmarks/sampler.py --workload long_tail (slot refill, and our static batch on the same
# lengths in the same process); the anchors are tunix_sampler.py and hf_generate.py with the
# long_tail argument (static batches) and hf_continuous_batching.py (transformers' continuous
# batching). They all run now: results.json holds no long_tail figure. Useful tokens/s =
# sum of lengths / median wall time of a call.
# Ours: benchmarks/sampler.py (bench-tiny, bench-small; one process each, so each peak RSS is
# its own) and benchmarks/rl_step.py (bench-tiny). Anchors: tunix_sampler.py, hf_generate.py
# (TRL venv, or HF_PY) and trl_grpo_step.py, run with the venvs that anchors/setup.sh builds;
# an anchor whose venv is absent (or all, with RUN_ANCHORS=0) takes its figure from
# anchors/results.json, and the table says which did. The CPU is shared: every result carries its load average, and a ratio is only as
# good as the two loads were alike.
set -euo pipefail
cd "$(dirname "$0")/.."
ANCHORS=${ANCHORS:-$(cd .. && pwd)/shared/anchors}
first_python() {  # first_python DIR... -> DIR/bin/python of the first DIR that has one
  local d; for d in "$@"; do [[ -x $d/bin/python ]] && { echo "$d/bin/python"; return; }; done
  echo "$1/bin/python"
}
TUNIX_PY=${TUNIX_PY:-$(first_python /work/venv_tunix /tmp/venv_tunix)}
TRL_PY=${TRL_PY:-$(first_python /work/venv_trl /tmp/venv_trl)}
HF_PY=${HF_PY:-$TRL_PY}   # any venv with the pinned torch + transformers runs hf_generate.py
PY=${PYTHON:-python}
OUT=${OUT:-$(mktemp -d /tmp/compare.XXXXXX)}
QUICK=${QUICK:-0}
REUSE=${REUSE:-0}
RUN_ANCHORS=${RUN_ANCHORS:-1}
LONG_TAIL=${LONG_TAIL:-all}   # 1: only the long_tail rows, 0: none, otherwise both
LONG_TAIL_ANCHORS=" ${LONG_TAIL_ANCHORS:-tunix_sampler hf_generate hf_continuous_batching} "
mkdir -p "$OUT"

result_line() {  # result_line LOG -> the last RESULT_JSON payload of LOG (or nothing)
  grep '^RESULT_JSON ' "$1" | tail -1 | cut -d' ' -f2- || true
}

# Figures are taken on cores that run nothing else: before each run, wait (up to
# QUIET_WAIT_S) for the 1-minute load average to fall to MAX_LOAD per core this script may
# use (`nproc`: 1 under `taskset -c 1`), and refuse the whole comparison if it does not.
# FORCE_LOADED=1 runs anyway (the load is still recorded with every result).
MAX_LOAD=${MAX_LOAD:-1.5}
QUIET_WAIT_S=${QUIET_WAIT_S:-240}
wait_quiet() {  # wait_quiet TAG -> returns when quiet; exits 3 when it stays loaded
  [[ $QUICK == 1 || ${FORCE_LOADED:-0} == 1 ]] && return 0
  local limit waited=0
  limit=$(awk -v m="$MAX_LOAD" -v c="$(nproc)" 'BEGIN { print m * c }')
  until awk -v l="$(cut -d' ' -f1 /proc/loadavg)" -v x="$limit" 'BEGIN { exit !(l <= x) }'; do
    if (( waited >= QUIET_WAIT_S )); then
      echo "compare.sh: refusing $1: load average $(cut -d' ' -f1-3 /proc/loadavg) stayed" \
           "above $limit ($MAX_LOAD x $(nproc) usable cores) for ${QUIET_WAIT_S}s;" \
           "stop what else runs, or FORCE_LOADED=1" >&2
      exit 3
    fi
    sleep 10; waited=$((waited + 10))
  done
}

run() {  # run TAG CMD... -> $OUT/TAG.log and $OUT/TAG.json
  local tag=$1 t0=$SECONDS rc=0 load0; shift
  wait_quiet "$tag"
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  "$@" > "$OUT/$tag.log" 2>&1 || rc=$?
  echo "$tag $load0 $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/loadavg.txt"
  local line; line=$(result_line "$OUT/$tag.log")
  if [[ $rc -eq 0 && -n $line ]]; then echo "$line" > "$OUT/$tag.json"
  else echo "{\"skipped\": \"rc=$rc; see $OUT/$tag.log\"}" > "$OUT/$tag.json"; fi
  echo "$tag: rc=$rc, $((SECONDS - t0)) s" >&2
}

if [[ $REUSE != 1 && $LONG_TAIL != 1 ]]; then
  if [[ $QUICK == 1 ]]; then
    run ours.sampler.bench-tiny "$PY" benchmarks/sampler.py --quick --no-memory-analysis
    cp "$OUT/ours.sampler.bench-tiny.json" "$OUT/ours.sampler.bench-small.json"
    run ours.rl_step.bench-tiny "$PY" benchmarks/rl_step.py --quick
  else
    for m in bench-tiny bench-small; do
      run "ours.sampler.$m" "$PY" benchmarks/sampler.py --models "$m"
    done
    run ours.rl_step.bench-tiny "$PY" benchmarks/rl_step.py
  fi
  if [[ $QUICK != 1 && $RUN_ANCHORS == 1 ]]; then  # each anchor whose venv is there
    for m in bench-tiny bench-small; do
      if [[ -x $TUNIX_PY ]]; then
        run "anchor.tunix_sampler.$m" "$TUNIX_PY" "$ANCHORS/tunix_sampler.py" "$m"; fi
      if [[ -x $HF_PY ]]; then
        run "anchor.hf_generate.$m" "$HF_PY" "$ANCHORS/hf_generate.py" "$m"; fi
    done
    if [[ -x $TRL_PY ]]; then
      run anchor.trl_grpo_step.bench-tiny "$TRL_PY" "$ANCHORS/trl_grpo_step.py" bench-tiny; fi
  fi
fi
if [[ $REUSE != 1 && $LONG_TAIL != 0 ]]; then  # ours and the three anchors, in sequence
  if [[ $QUICK == 1 ]]; then
    run ours.long_tail.bench-tiny "$PY" benchmarks/sampler.py --workload long_tail --quick
  else
    run ours.long_tail.bench-tiny "$PY" benchmarks/sampler.py --workload long_tail \
      --models bench-tiny
  fi
  if [[ $QUICK != 1 && $RUN_ANCHORS == 1 ]]; then
    wanted() { [[ $LONG_TAIL_ANCHORS == *" $1 "* ]]; }
    if [[ -x $TUNIX_PY ]] && wanted tunix_sampler; then
      run anchor.tunix_sampler.long_tail "$TUNIX_PY" "$ANCHORS/tunix_sampler.py" bench-tiny \
        long_tail; fi
    if [[ -x $HF_PY ]] && wanted hf_generate; then
      run anchor.hf_generate.long_tail "$HF_PY" "$ANCHORS/hf_generate.py" bench-tiny long_tail
    fi
    if [[ -x $HF_PY ]] && wanted hf_continuous_batching; then
      run anchor.hf_continuous_batching.long_tail "$HF_PY" \
        "$ANCHORS/hf_continuous_batching.py" bench-tiny
    fi
  fi
fi

OUT="$OUT" ANCHORS="$ANCHORS" QUICK="$QUICK" LONG_TAIL="$LONG_TAIL" "$PY" - <<'EOF'
import glob, json, os

out, anchors = os.environ["OUT"], os.environ["ANCHORS"]
quick = os.environ["QUICK"] == "1"
long_tail_only = os.environ["LONG_TAIL"] == "1"


def load(tag):
    path = os.path.join(out, tag + ".json")
    if not os.path.exists(path):
        return None
    r = json.load(open(path))
    return None if "skipped" in r else r


stored = {}
results_json = os.path.join(anchors, "results.json")
if os.path.exists(results_json):
    stored = json.load(open(results_json)).get("runs", {})
fresh = bool(glob.glob(os.path.join(out, "anchor.*.json")))
source = {}


def anchor(tag):
    r = load("anchor." + tag)
    if r is not None:
        source[tag] = "this run"
        return r
    r = stored.get(tag)
    if r is not None and "skipped" not in r:
        source[tag] = "results.json"
        return r
    return None


rows = []  # (workload, ours, anchor name, anchor value, ratio ours/anchor, better)
for m in ("bench-tiny", "bench-small"):
    ours = load(f"ours.sampler.{m}")
    for name, tag in (("Tunix", f"tunix_sampler.{m}"), ("HF generate", f"hf_generate.{m}")):
        a = anchor(tag) if ours else None  # the note lists only the anchors used
        if ours and a:
            name += "*" if source[tag] == "results.json" else ""
            rows.append((f"sampler {m} (tok/s)", ours["decode_tok_s"], name,
                         a["decode_tok_s"], ours["decode_tok_s"] / a["decode_tok_s"], "higher"))
rl = load("ours.rl_step.bench-tiny")
trl = anchor("trl_grpo_step.bench-tiny") if rl else None
trl_name = "TRL" + ("*" if source.get("trl_grpo_step.bench-tiny") == "results.json" else "")
if rl and trl:
    rows.append(("GRPO step bench-tiny (s)", rl["step_s_median"], trl_name,
                 trl["step_s_median"], rl["step_s_median"] / trl["step_s_median"], "lower"))
    for part, theirs in (("sample", "generate"),
                         ("train", "policy_fwd_loss_bwd")):
        rows.append((f"  {part} part (s)", rl["split_s_median"][part], trl_name,
                     trl["split_s_median"][theirs],
                     rl["split_s_median"][part] / trl["split_s_median"][theirs], "lower"))
    ref = rl["split_s_median"]["reference"] + rl["split_s_median"]["score"]
    rows.append(("  reference + score (s)", ref, trl_name,
                 trl["split_s_median"]["score_ref_logps_reward"],
                 ref / trl["split_s_median"]["score_ref_logps_reward"], "lower"))
LONG_TAIL_ANCHORS = (("Tunix (static)", "tunix_sampler.long_tail"),
                     ("HF generate (static)", "hf_generate.long_tail"),
                     ("HF continuous batching", "hf_continuous_batching.long_tail"))
lt = load("ours.long_tail.bench-tiny")
if lt:
    w = "long_tail bench-tiny (useful tok/s)"
    rows.append((w, lt["useful_tok_s"], "ours static", lt["static_useful_tok_s"],
                 lt["useful_tok_s"] / lt["static_useful_tok_s"], "higher"))
    for name, tag in LONG_TAIL_ANCHORS:
        a = anchor(tag)
        if a:
            rows.append((w, lt["useful_tok_s"], name, a["useful_tok_s"],
                         lt["useful_tok_s"] / a["useful_tok_s"], "higher"))

print(f"results in {out}" + ("   [QUICK: 'test' preset against bench anchors: the ratios "
                             "mean nothing]" if quick else ""))
print()
print("| workload | ours | anchor | anchor's | ours / anchor | better |")
print("|---|---|---|---|---|---|")
for w, o, name, a, ratio, better in rows:
    fmt = (lambda x: f"{x:,.0f}") if "tok/s" in w else (lambda x: f"{x:.2f}")
    print(f"| {w} | {fmt(o)} | {name} | {fmt(a)} | {ratio:.2f} | {better} |")
print()
for m in ("bench-tiny", "bench-small"):
    r = load(f"ours.sampler.{m}")
    if r:
        print(f"ours sampler {m}: {r['achieved_gflops']} GFLOP/s = "
              f"{100 * r['roofline_fraction']:.0f}% of XLA's {r['matmul_rate_gflops']} GFLOP/s "
              f"matmul rate at its shapes ({100 * r['roofline_fraction_matmul_params']:.0f}% "
              f"counting matmul params only), "
              + (f"{100 * r['fraction_of_peak']:.0f}% of the machine's best "
                 f"{r['peak_gflops']} GFLOP/s {r['peak_parts']}" if "fraction_of_peak" in r
                 else "no peak rate in this result")
              + f"; compile {r['compile_s']:.1f} s, peak RSS {r['peak_rss_mib']:.0f} MiB, "
              f"load {r['loadavg_start']} -> {r['loadavg_end']}")
if lt:
    print(f"ours long_tail bench-tiny: rows stop by {lt.get('stops', 'budget')}, queue "
          f"{lt.get('queue', 'longest_first')}; slot refill, {lt['slots']} slots "
          f"({lt.get('slots_rule', '--slots')}) shrinking through {lt.get('slot_levels')}, "
          f"refill every {lt['refill_every']} steps: occupancy {100 * lt['slot_occupancy']:.1f}% (static "
          f"{100 * lt['static_slot_occupancy']:.1f}%), KV cache "
          f"{lt['kv_cache_bytes'] / 2**20:.1f} MiB (static "
          f"{lt['static_kv_cache_bytes'] / 2**20:.1f} MiB), {lt['useful_tokens']} useful "
          f"tokens in {lt['median_s']:.2f} s (static {lt['static_median_s']:.2f} s)")
    known = lt.get("budgets_known_in_advance")
    if known:
        print(f"ours long_tail bench-tiny with per-row budgets known in advance (queue "
              f"{known['queue']}; not what an RL step knows): {known['useful_tok_s']:,.0f} "
              f"useful tok/s, {known['speedup_vs_static']:.2f}x our static batch, occupancy "
              f"{100 * known['slot_occupancy']:.1f}%")
    for name, tag in LONG_TAIL_ANCHORS:
        a = anchor(tag)
        if a:
            best = (f" (best of requests per batch {[p.get('max_requests_per_batch') for p in a['sweep']]}"
                    f": {a.get('max_requests_per_batch')})" if a.get("sweep") else "")
            print(f"anchor long_tail {name}: {a['useful_tok_s']:,.0f} useful tok/s, median "
                  f"{a['median_s']:.2f} s{best}, {a.get('backend', '')}")
loadavg_txt = os.path.join(out, "loadavg.txt")
if os.path.exists(loadavg_txt):  # every run's 1/5/15-min load average, before -> after
    print("load: " + "; ".join(f"{t[0]} {' '.join(t[1:4])} -> {' '.join(t[4:7])}"
                               for t in (line.split() for line in open(loadavg_txt))
                               if len(t) == 7))
if rl:
    print(f"ours GRPO step: split {({k: round(v, 3) for k, v in rl['split_s_median'].items()})}"
          f", roofline fractions {rl['roofline_fraction']}, load {rl['loadavg_start']}")
date = (json.load(open(results_json)).get("date_utc", "?") if os.path.exists(results_json)
        else "?")
now = sorted(t for t, v in source.items() if v == "this run")
old = sorted(t for t, v in source.items() if v == "results.json")
note = "; ".join(part for part in (
    f"anchors run now, at the same load: {', '.join(now)}" if now else "",
    f"anchors* from results.json ({date}, unloaded machine; their venvs absent or "
    f"RUN_ANCHORS=0): {', '.join(old)}" if old else "") if part) or "no anchors"
print(f"note: {note}")

# What the hardware allows: a ratio target is out of reach when meeting it would take more
# than XLA's measured float32 matmul rate (roofline.py, measured in our run) -- the anchor's
# achieved FLOP rate, in the same FLOP count, is its tokens/s times ours per token.
ceilings = []
for m in ("bench-tiny", "bench-small"):
    ours = load(f"ours.sampler.{m}")
    a = anchor(f"tunix_sampler.{m}") if ours else None
    if ours and a:
        theirs = ours["roofline_fraction"] * a["decode_tok_s"] / ours["decode_tok_s"]
        ceilings.append(f"sampler {m}: Tunix ran at {100 * theirs:.0f}% of the matmul rate "
                        f"at the decode shapes, ours at {100 * ours['roofline_fraction']:.0f}%, "
                        f"2x Tunix needs {200 * theirs:.0f}%")
if rl and trl:
    best = sum(rl["split_s_median"][part] * min(1.0, rl["roofline_fraction"][part])
               for part in ("sample", "reference", "train"))
    ceilings.append(f"GRPO step with every part at 100% of its matmul rate: {best:.2f} s = "
                    f"{best / trl['step_s_median']:.2f}x TRL's time")
if ceilings:
    print("ceiling: " + "; ".join(ceilings))


def ratio(workload_prefix, name):
    return next((r[4] for r in rows if r[0].startswith(workload_prefix)
                 and r[2].rstrip("*") == name), None)


parts = []
for m in ("bench-tiny", "bench-small"):
    t, h = ratio(f"sampler {m}", "Tunix"), ratio(f"sampler {m}", "HF generate")
    if t is not None and h is not None:
        parts.append(f"sampler {m} {t:.2f}x Tunix {'OK' if t >= 2 else 'MISS'}(>=2), "
                     f"{h:.2f}x HF {'OK' if h >= 1.5 else 'MISS'}(>=1.5)")
small = load("ours.sampler.bench-small")
if small:
    f = small["roofline_fraction"]
    p = small.get("fraction_of_peak", f)
    parts.append(f"bench-small at {100 * f:.0f}% of XLA's matmul rate at its shapes, "
                 f"{100 * p:.0f}% of the machine's best {'OK' if min(f, p) >= 0.5 else 'MISS'}"
                 f"(>=50%)")
g = ratio("GRPO step", "TRL")
if g is not None:
    parts.append(f"GRPO step {g:.2f}x TRL's time {'OK' if g <= 0.5 else 'MISS'}(<=0.5)")
if lt:
    got = {name: ratio("long_tail", name) for name in
           ("Tunix (static)", "HF continuous batching", "ours static")}
    targets = (("Tunix (static)", "Tunix", 8), ("HF continuous batching", "HF CB", 5),
               ("ours static", "our static", 3))
    parts.append(f"long_tail (stops {lt.get('stops', 'budget')}, queue "
                 f"{lt.get('queue', 'longest_first')}) " + ", ".join(
        f"{got[k]:.2f}x {label} {'OK' if got[k] >= t else 'MISS'}(>={t})"
        for k, label, t in targets if got[k] is not None)
        + f", occupancy {100 * lt['slot_occupancy']:.1f}% "
        f"{'OK' if lt['slot_occupancy'] >= 0.9 else 'MISS'}(>=90%), KV cache "
        f"{lt['kv_cache_bytes'] / lt['static_kv_cache_bytes']:.2f}x static's "
        f"{'OK' if lt['kv_cache_bytes'] <= lt['static_kv_cache_bytes'] else 'MISS'}(<=1)")
loads = [r["loadavg_start"][0] for r in (load("ours.sampler.bench-tiny"), small, rl, lt) if r]
print("summary: " + ("; ".join(parts) if parts else "no comparable results")
      + (f"; load {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} cores" if loads else "")
      + ("; QUICK (behaviour only)" if quick else ""))
EOF
