"""The timing side of benchmarks/learning_vs_trl.py: one thread per process on both sides,
the `timed` record of a training run (load average and matmul probe around it), and the
report's refusal to write a JSON whose runs ran on a loaded machine. No TRL, no training."""
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import learning_vs_trl as lvt  # noqa: E402
import learning_vs_trl_report as lvt_report  # noqa: E402


def test_threads_follow_the_anchors_convention():
    assert lvt.thread_count({}, cores=1) == 1
    assert lvt.thread_count({}, cores=3) == 3
    assert lvt.thread_count({"ANCHOR_THREADS": "2"}, cores=1) == 2
    assert lvt.thread_count({}) == len(os.sched_getaffinity(0))
    for bad in ("0", "two", "-1"):
        with pytest.raises(ValueError, match="ANCHOR_THREADS"):
            lvt.thread_count({"ANCHOR_THREADS": bad}, cores=1)


def test_child_env_gives_each_side_its_thread_setting():
    trl = lvt.child_env("trl", 1, {"PATH": "/bin"})
    assert trl == {"PATH": "/bin", "OMP_NUM_THREADS": "1", "ANCHOR_THREADS": "1"}
    ours = lvt.child_env("ours", 1, {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"})
    assert ours["XLA_FLAGS"] == ("--xla_force_host_platform_device_count=1 "
                                 "--xla_cpu_multi_thread_eigen=false")
    assert ours["OMP_NUM_THREADS"] == "1" and "ANCHOR_THREADS" not in ours
    chosen = lvt.child_env("ours", 1, {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=true"})
    assert chosen["XLA_FLAGS"] == "--xla_cpu_multi_thread_eigen=true"  # the caller's wins
    with pytest.raises(ValueError, match="side"):
        lvt.child_env("tunix", 1, {})


def _record(before=0.4, during=(0.9,), after=1.0, cores=(1,)):
    return {"cpu_affinity": list(cores), "load_before": [before, 0.0, 0.0],
            "load_samples": [[30.0 * (i + 1), x] for i, x in enumerate(during)],
            "load_after": [after, 0.0, 0.0]}


def test_load_limit_is_per_pinned_core_and_counts_before_during_and_after():
    assert lvt.LOAD_LIMIT_PER_CORE == 1.5
    quiet = {0: {"ours": _record(), "trl": _record(after=1.5)}}  # at the limit: allowed
    assert lvt.load_violations(quiet) == []
    assert lvt.load_peak(_record(during=(0.9, 2.0, 1.1))) == 2.0
    loaded = {0: {"ours": _record(), "trl": _record(during=(1.2, 9.95))},
              1: {"ours": _record(before=1.6), "trl": _record()}}
    assert lvt.load_violations(loaded) == [
        "seed 0 trl: load average 9.95 on 1 pinned core(s), limit 1.50",
        "seed 1 ours: load average 1.60 on 1 pinned core(s), limit 1.50"]
    two_cores = {0: {"ours": _record(during=(2.9,), cores=(0, 1))}}
    assert lvt.load_violations(two_cores) == []
    assert lvt.load_violations({0: {"ours": _record(after=3.1, cores=(0, 1))}}) == [
        "seed 0 ours: load average 3.10 on 2 pinned core(s), limit 3.00"]


def test_report_refuses_a_loaded_run_and_records_it_for_a_pipeline_check():
    loaded = {0: {"ours": _record(), "trl": _record(during=(8.0,))}}
    with pytest.raises(SystemExit) as e:
        lvt_report.load_check(loaded, pipeline_check=False, out="docs/x.json")
    message = str(e.value.code)
    assert message.startswith("learning_vs_trl report: refusing to write docs/x.json")
    assert "seed 0 trl: load average 8.00" in message and "quiet machine" in message
    check = lvt_report.load_check(loaded, pipeline_check=True, out="docs/x.json")
    assert check == {"limit_per_core": 1.5, "enforced": False,
                     "violations": ["seed 0 trl: load average 8.00 on 1 pinned core(s), "
                                    "limit 1.50"]}
    quiet = {0: {"ours": _record(), "trl": _record()}}
    assert lvt_report.load_check(quiet, False, "x")["violations"] == []


def test_report_needs_the_timed_records(tmp_path):
    (tmp_path / "ours.timed.json").write_text("{}")
    with pytest.raises(ValueError, match=r"trl\.timed\.json: no record of the trl training"):
        lvt_report.read_timed(str(tmp_path))


def test_timed_records_the_run_and_passes_on_a_failure(tmp_path, monkeypatch):
    """A real (trivial) command through the subcommand: the record's fields, the child's
    thread settings, and no record when the command fails."""
    monkeypatch.delenv("ANCHOR_THREADS", raising=False)
    monkeypatch.setattr(lvt, "matmul_gflops", lambda: 12.5)  # the probe itself: below
    record = tmp_path / "ours.timed.json"
    child = ("import json, os; print('CHILD ' + json.dumps({k: os.environ.get(k) for k in "
             "('OMP_NUM_THREADS', 'XLA_FLAGS')}))")
    lvt.main(["timed", "--side", "ours", "--seed", "3", "--record", str(record),
              "--sample_s", "0.05", "--", sys.executable, "-c",
              "import time; time.sleep(0.3); " + child])
    r = json.loads(record.read_text())
    threads = len(os.sched_getaffinity(0))
    assert r["side"] == "ours" and r["seed"] == 3 and r["threads"] == threads
    assert r["cpu_affinity"] == sorted(os.sched_getaffinity(0))
    assert r["env"]["OMP_NUM_THREADS"] == str(threads)
    assert "--xla_cpu_multi_thread_eigen=false" in r["env"]["XLA_FLAGS"]
    assert 0.3 <= r["wall_s"] < 30
    assert len(r["load_before"]) == len(r["load_after"]) == 3 and r["load_samples"]
    assert r["load_peak"] == lvt.load_peak(r)
    assert r["probe_gflops_before"] == r["probe_gflops_after"] == 12.5
    failed = tmp_path / "trl.timed.json"
    with pytest.raises(SystemExit) as e:
        lvt.main(["timed", "--side", "trl", "--seed", "0", "--record", str(failed), "--",
                  sys.executable, "-c", "raise SystemExit(7)"])
    assert e.value.code == 7 and not failed.exists()


def test_matmul_probe_measures_something():
    assert 0.01 < lvt.matmul_gflops(n=64, reps=2) < 1e5
