"""Hostile code answers against the code sandbox and the code reward.

Before: a Python audit hook was the boundary (reachable through `sys._getframe` and switched
off), the sandbox kept CAP_DAC_READ_SEARCH, `fork`+`setsid` children outlived the kill, the
same-uid mode reached 127.0.0.1 and killed its parent, assert tests ran in the sandbox next
to a readable tests file and a `report(done)` the code could call, and an example's
`"limits"` could switch protections off. Each test below is one of those attacks (or one of
ours) and must fail to break out, forge a verdict or leak.
"""
from __future__ import annotations

import os
import socket
import time

import pytest

from jaxrl_reason.rewards import code as code_mod
from jaxrl_reason.rewards import isolation
from jaxrl_reason.rewards.code import SandboxLimits, code_reward, run_sandboxed

pytestmark = pytest.mark.skipif(not isolation.available(), reason="bubblewrap unavailable")

FAST = SandboxLimits(wall_s=2.0, cpu_s=1.0, memory_bytes=256 * 2**20, output_bytes=8192,
                     max_processes=64)
MARKER = "zq-expected-7f3a91"  # an expected value the sandbox must never see


def fenced(code: str) -> str:
    return f"```python\n{code}\n```"


def score(code: str, tests, **example) -> float:
    return code_reward(fenced(code), {"tests": tests, **example}, limits=FAST).score


# ------------------------------------------------------------------ breaking out (item 3, 5)

HOOK_BYPASS = """
import sys
try:
    hook = sys._getframe(1).f_locals.get('hook')
    for cell in hook.__closure__ or ():
        if callable(cell.cell_contents):
            cell.cell_contents = lambda e, a: True
except Exception:
    pass
"""


@pytest.mark.parametrize("read", [
    "open('/etc/shadow').read()",
    "open('/root/.bash_history').read()",
    f"open({os.path.join(os.path.dirname(code_mod.__file__), 'math.py')!r}).read()",
    "open('/work/main/pyproject.toml').read()",
    "__import__('readline').read_history_file('/etc/shadow')",
    "open('/proc/1/environ').read()",
])
def test_host_files_are_unreachable_even_after_the_old_hook_bypass(read):
    res = run_sandboxed(HOOK_BYPASS + f"print({read})", "", FAST)
    assert res.status == "error", res
    assert res.stdout == ""


def test_no_capabilities_no_privileges_own_uid():
    res = run_sandboxed(
        "import os\nst = dict(l.split(':', 1) for l in open('/proc/self/status').read()"
        ".splitlines())\nprint(st['CapEff'].strip(), st['CapBnd'].strip(), "
        "st['NoNewPrivs'].strip(), os.getuid())", "", FAST)
    caps_eff, caps_bnd, nnp, uid = res.stdout.split()
    assert caps_eff == "0000000000000000" and nnp == "1"
    if os.geteuid() == 0:
        assert caps_bnd == "0000000000000000" and int(uid) >= isolation.UID_BASE


def test_setsid_grandchild_does_not_outlive_the_run(tmp_path, monkeypatch):
    # The old attack wrote a file 8 s after the sandbox returned; here the child cannot see
    # tmp_path at all, and must also be gone when the run returns.
    uids, real = [], isolation.sandbox_command

    def recording(*args, **kwargs):
        cmd = real(*args, **kwargs)
        uids.extend(int(a.split("=")[1]) for a in cmd if a.startswith("--reuid="))
        return cmd

    monkeypatch.setattr(isolation, "sandbox_command", recording)
    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        time.sleep(0.5)\n"
            f"        open({str(tmp_path / 'late.txt')!r}, 'w').write('x')\n"
            "        time.sleep(100)\n")
    run_sandboxed(code, "", FAST)
    time.sleep(1.0)
    assert not (tmp_path / "late.txt").exists()
    live = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                uid = int(f.read().split("Uid:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue
        if uid in uids:
            live.append(pid)
    assert live == []
    assert uids or os.geteuid() != 0


def test_localhost_listener_is_unreachable():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        res = run_sandboxed("import socket\n"
                            f"socket.create_connection(('127.0.0.1', {port}), timeout=1)",
                            "", FAST)
        assert res.status == "error"
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


@pytest.mark.parametrize("attack", [
    "os.kill(os.getppid(), 9)",
    "os.kill({pid}, 0)",
    "os.kill(-1, 9)",
    "signal.pidfd_send_signal(os.pidfd_open({pid}), 9)",
    "open('/proc/{pid}/mem', 'rb').read(1)",
])
def test_trainer_cannot_be_signalled_or_read(attack):
    res = run_sandboxed("import os, signal\n" + attack.format(pid=os.getpid()), "", FAST)
    assert os.getppid() > 0  # still alive to assert
    assert res.status in ("error", "ok")
    if "{pid}" in attack:
        assert res.status == "error"


@pytest.mark.parametrize("attack", [
    "import os\nos.mkfifo('{dir}/fifo')",
    "import sqlite3\nc = sqlite3.connect(':memory:')\nc.execute(\"ATTACH '{dir}/x.db' AS x\")\n"
    "c.execute('CREATE TABLE x.t (a)')",
    "import readline\nreadline.write_history_file('{dir}/h')",
    "import os\nos.symlink('{dir}', '/tmp/l')\nopen('/tmp/l/y', 'w').write('y')",
])
def test_no_file_appears_outside(attack, tmp_path):
    run_sandboxed(attack.format(dir=tmp_path), "", FAST)
    assert list(tmp_path.iterdir()) == []


def test_trainer_environment_does_not_leak(monkeypatch):
    monkeypatch.setenv("JAXRL_TEST_SECRET", MARKER)
    res = run_sandboxed("import os\nprint(dict(os.environ))\nprint(open('/proc/1/cmdline').read())",
                        "", FAST)
    assert MARKER not in res.stdout


# ------------------------------------------------------------------- forging verdicts (item 4)

TESTS = [f"assert f(3) == {MARKER!r}"]


def test_honest_solution_passes():
    assert score(f"def f(x):\n    return {MARKER!r}", TESTS) == 1.0


@pytest.mark.parametrize("cheat", [
    # call the old harness's report through frames, then leave
    "import sys, os\nfor fr in [sys._getframe(i) for i in range(1, 3)]:\n"
    "    r = fr.f_locals.get('report')\n    if r:\n        r('result [[\"ok\", {\"t\": \"atom\","
    " \"v\": \"wrong\"}]]')\nos._exit(0)",
    # an object equal to everything
    "class A:\n    def __eq__(self, o):\n        return True\n    __hash__ = None\n"
    "def f(x):\n    return A()",
    # a str subclass equal to everything
    "class S(str):\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return S('')",
    # read the tests from anywhere it could be (file, argv, /proc)
    "import os\ndef f(x):\n    for root in ('/tmp', '/proc/self', '/work', '/root'):\n"
    "        for d, _, files in os.walk(root):\n            for n in files:\n"
    "                try:\n                    t = open(os.path.join(d, n), errors='ignore')"
    ".read(100000)\n                except Exception:\n                    continue\n"
    "                if 'zq-expected' in t:\n                    i = t.index('zq-expected')\n"
    "                    return t[i:i + 18]\n    return None",
    # exit before the calls run
    "import os\nos._exit(0)",
    # forge a result line with a guessed value
    "import os\nos.write(3, b'result [[\"ok\", {\"t\": \"atom\", \"v\": \"guess\"}]]\\n')\n"
    "def f(x):\n    return 'guess'",
])
def test_cheats_score_zero(cheat):
    assert score(cheat, TESTS) == 0.0


def test_stdio_expected_output_never_enters_the_sandbox():
    code = ("import os\nfound = ''\nfor d, _, fs in os.walk('/'):\n"
            "    if d.startswith(('/proc', '/sys', '/usr', '/dev')):\n        continue\n"
            "    for n in fs:\n        try:\n"
            "            t = open(os.path.join(d, n), errors='ignore').read(100000)\n"
            "        except Exception:\n            continue\n"
            "        if 'zq-expected' in t:\n            found = t\n"
            "print(found[found.index('zq-expected'):][:18] if found else 'none')")
    assert score(code, [{"input": "", "output": MARKER}]) == 0.0


# --------------------------------------------------------------- data weakening limits (8a)

@pytest.mark.parametrize("limits", [
    {"run_as_nobody": False}, {"network_namespace": False}, {"allow_unsandboxed_unsafe": True},
    {"wall_s": float("nan")}, {"memory_bytes": -1}, {"cpu_s": "100"},
])
def test_example_limits_cannot_switch_protections_off(limits):
    with pytest.raises(ValueError, match="limits"):
        score("def f(x):\n    return 1", TESTS, limits=limits)


def test_example_limits_only_tighten():
    base = SandboxLimits(wall_s=2.0, memory_bytes=2**28, max_processes=None)
    out = code_mod.tighten(base, {"wall_s": 100.0, "memory_bytes": 2**20, "max_processes": 8})
    assert (out.wall_s, out.memory_bytes, out.max_processes) == (2.0, 2**20, 8)
    t0 = time.monotonic()
    assert score("import time\ntime.sleep(5)\nprint(1)", [{"input": "", "output": "1"}],
                 limits={"wall_s": 1000.0}) == 0.0
    assert time.monotonic() - t0 < FAST.wall_s + 1.5


def test_refuses_without_sandbox_unless_unsafe_flag(monkeypatch):
    monkeypatch.setattr(isolation, "available", lambda: False)
    with pytest.raises(RuntimeError, match="allow_unsandboxed_unsafe"):
        code_reward(fenced("print(1)"), {"tests": [{"input": "", "output": "1"}]}, limits=FAST)
    with pytest.warns(RuntimeWarning, match="WITHOUT"):
        code_mod._WARNED.clear()
        out = code_reward(fenced("print(1)"), {"tests": [{"input": "", "output": "1"}]},
                          limits=FAST, allow_unsandboxed_unsafe=True)
    assert out.score == 1.0


@pytest.mark.parametrize("call", [
    "socket.socket(socket.AF_INET)",
    "socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)",
    "socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)",
    "ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0 or oops",
    "ctypes.CDLL(None, use_errno=True).ptrace(16, 1, 0, 0) == 0 or oops",
    "ctypes.CDLL(None, use_errno=True).mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0 or oops",
])
def test_seccomp_denies_kernel_attack_surface(call):
    res = run_sandboxed(f"import ctypes, socket\nprint({call})", "", FAST)
    assert res.status == "error", res
    assert "PermissionError" in res.stderr_tail or "NameError" in res.stderr_tail


# (syscall, arguments, errno the filter answers): without the filter each fails otherwise
# (EBADF, EINVAL, EFAULT, EOPNOTSUPP), even as root, which the host check below asserts
SECCOMP_PROBES = [
    ("pidfd_getfd", (-1, 0, 0), 1), ("process_madvise", (-1, 0, 0, 0, 0), 1),
    ("io_uring_setup", (0, 0), 1), ("userfaultfd", (0xFFFF,), 1),
    ("perf_event_open", (0, 0, -1, -1, 0), 1), ("socketpair", (2, 1, 0, 0), 1),
    ("clone3", (0, 0), 38),
]
PROBE = """import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
out = []
for nr, args in {calls}:
    ctypes.set_errno(0)
    out.append((libc.syscall(nr, *args), ctypes.get_errno()))
print(json.dumps(out))
"""


def test_seccomp_errnos_by_syscall_number():
    """The filter answers each probe with its errno in the sandbox, where the same calls on
    the host (no filter) fail with another one; numbers come from libseccomp, so the probe
    holds on x86-64 and aarch64 alike."""
    import json
    import subprocess
    import sys

    import pyseccomp

    calls = [(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name), list(args))
             for name, args, _ in SECCOMP_PROBES]
    code = PROBE.format(calls=calls)
    host = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                     text=True, check=True).stdout)
    res = run_sandboxed(code, "", FAST)
    assert res.status == "ok", res
    for (name, _, errno), (h_ret, h_err), (s_ret, s_err) in zip(
            SECCOMP_PROBES, host, json.loads(res.stdout)):
        assert h_ret == -1 and h_err != errno, (name, h_ret, h_err)
        assert (s_ret, s_err) == (-1, errno), (name, s_ret, s_err)


@pytest.fixture
def no_libseccomp(monkeypatch):
    """`import pyseccomp` failing as it does on a host without libseccomp.so.2, with the
    cached sandbox check and program cleared before and after."""
    import ctypes.util
    import sys

    real = ctypes.util.find_library
    monkeypatch.setattr(ctypes.util, "find_library",
                        lambda name: None if name == "seccomp" else real(name))
    monkeypatch.delitem(sys.modules, "pyseccomp", raising=False)
    isolation._unavailable.cache_clear()
    isolation.seccomp_program.cache_clear()
    yield
    isolation._unavailable.cache_clear()
    isolation.seccomp_program.cache_clear()


def test_refuses_code_rewards_without_libseccomp(no_libseccomp):
    assert not isolation.available()
    with pytest.raises(isolation.SeccompUnavailable, match="libseccomp.so.2"):
        isolation.seccomp_fd()
    with pytest.raises(RuntimeError, match=r"libseccomp\.so\.2.*allow_unsandboxed_unsafe"):
        code_reward(fenced("print(1)"), {"tests": [{"input": "", "output": "1"}]}, limits=FAST)
    with pytest.warns(RuntimeWarning, match="WITHOUT"):
        code_mod._WARNED.clear()
        out = code_reward(fenced("print(1)"), {"tests": [{"input": "", "output": "1"}]},
                          limits=FAST, allow_unsandboxed_unsafe=True)
    assert out.score == 1.0


def test_seccomp_keeps_ordinary_programs_working():
    res = run_sandboxed("import os, socket, subprocess, threading\n"
                        "a, b = socket.socketpair()\na.send(b'x')\n"
                        "t = threading.Thread(target=print, args=(b.recv(1).decode(),))\n"
                        "t.start()\nt.join()\n"
                        "print(subprocess.run(['echo', 'hi'], capture_output=True).stdout)",
                        "", FAST)
    assert (res.status, res.stdout) == ("ok", "x\nb'hi\\n'\n"), res


def test_pool_refuses_code_rewards_without_sandbox(monkeypatch):
    """Refused when the pool is built, not per call (where it would only count as a reason)."""
    from jaxrl_reason.rewards import RewardPool

    monkeypatch.setattr(isolation, "available", lambda: False)
    for weights in ({"code": 1.0}, {"domain_verifier": 1.0}):
        with pytest.raises(RuntimeError, match="allow_unsandboxed_unsafe"):
            RewardPool(weights, num_workers=1)
    with pytest.warns(RuntimeWarning, match="WITHOUT"):
        code_mod._WARNED.clear()
        pool = RewardPool({"code": 1.0}, num_workers=1,
                          options={"code": {"allow_unsandboxed_unsafe": True}})
    pool.close()
    RewardPool({"correctness": 1.0}, num_workers=1).close()  # other rewards are unaffected
