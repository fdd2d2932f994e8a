"""Tests for code extraction, the sandboxed runner and the `code` reward.

Every sandboxed run starts a Python process (~50 ms); the limits below keep the timeouts
short so the whole file runs in a few seconds.
"""
import ast
import json
import os
import tempfile
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_reason.rewards import get_reward, isolation
from jaxrl_reason.rewards.code import (
    SandboxLimits,
    code_reward,
    extract_code,
    run_sandboxed,
)

FAST = SandboxLimits(wall_s=1.0, cpu_s=1.0, memory_bytes=256 * 2**20, output_bytes=4096,
                     max_processes=64)
SLACK_S = 1.5  # a killed run returns within its wall limit plus this


def run(code, stdin="", **kw):
    return run_sandboxed(code, stdin, FAST, **kw)


def fenced(code):
    return f"Here is my solution.\n```python\n{code}\n```\n"


UIDS: list[int] = []  # the sandbox uids this module's runs used (as root: one per run)


@pytest.fixture(autouse=True)
def record_sandbox_uids(monkeypatch):
    """Record the uid of every sandbox started here, so the leftover-process checks look at
    this module's runs only (other test processes may run sandboxes at the same time)."""
    real = isolation.sandbox_command

    def recording(*args, **kwargs):
        cmd = real(*args, **kwargs)
        UIDS.extend(int(a.split("=")[1]) for a in cmd if a.startswith("--reuid="))
        return cmd

    monkeypatch.setattr(isolation, "sandbox_command", recording)


def sandbox_processes():
    """Pids of live processes that run as a uid of this module's sandboxes."""
    uids, pids = set(UIDS), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status") as f:
                uid = int(next(line for line in f if line.startswith("Uid:")).split()[1])
        except (OSError, StopIteration, ValueError):
            continue
        if uid in uids:
            pids.append(int(pid))
    return pids


def no_sandbox_processes(within_s=2.0):
    """Whether every sandbox process is gone within `within_s` (as root; without root there
    is no dedicated uid to look for, and the pid namespace's teardown is the guarantee)."""
    deadline = time.monotonic() + within_s
    while sandbox_processes():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# ---------------------------------------------------------------------------- extraction

EXTRACT = [
    ("```python\nprint(1)\n```", "print(1)"),
    ("```py\nx = 1\n```", "x = 1"),
    ("```Python3\nx = 1\n```", "x = 1"),
    ("```\nprint(2)\n```", "print(2)"),
    ("a\n```python\nprint(1)\n```\nthen\n```python\nprint(2)\n```\nend", "print(2)"),
    ("```python\nprint(1)\n```\n```bash\nls\n```", "print(1)"),
    ("```bash\nls\n```\n```python\nprint(3)\n```", "print(3)"),
    ("  ```python\n  def f():\n      return 1\n  ```", "def f():\n    return 1"),
    ("<answer>print(4)</answer>", "print(4)"),
    ("<think>hmm</think><answer>\n```python\nprint(5)\n```\n</answer>", "print(5)"),
    ("<answer>a</answer> <answer>\nprint(6)\n</answer>", "print(6)"),
    ("```python\nprint(1)", None),  # unclosed fence
    ("```python\n\n```", None),
    ("<answer> </answer>", None),
    ("no code here", None),
    ("", None),
]


@pytest.mark.parametrize("text,code", EXTRACT)
def test_extract_code(text, code):
    assert extract_code(text) == code


def test_extract_code_non_str():
    assert extract_code(None) is None
    assert extract_code(b"```python\nprint(1)\n```") is None


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("`python\n <>/answer x=1()")), max_size=80))
def test_extract_code_never_raises(text):
    out = extract_code(text)
    assert out is None or (isinstance(out, str) and out.strip())


# ------------------------------------------------------------------------------- runner


def test_trivial_run_is_fast_and_cleans_up():
    res = run("import os\nd = sorted(os.listdir('.'))\n"
              "mine = [x for x in d if x.startswith('jaxrl_code_')]\n"
              "print(os.getcwd(), len(mine), os.listdir(mine[0]), mine[0], ','.join(d))")
    # a private /tmp holding the read-only directory of the solution file, and nothing else
    # but the read-only host paths bound there when they live under the host's /tmp (a
    # virtualenv or an editable checkout made by mktemp, as CI's are)
    cwd, count, listing, name, entries = res.stdout.split()
    assert (res.status, cwd, count, listing) == ("ok", "/tmp", "1", "['solution.py']")
    harness = os.path.join(os.path.dirname(os.path.abspath(run_sandboxed.__code__.co_filename)),
                           "_code_harness.py")
    host = {p.split("/")[2] for p in isolation.host_paths([harness]) if p.startswith("/tmp/")}
    assert set(entries.split(",")) - {name} == host
    assert res.wall_s < 1.0
    assert name.startswith("jaxrl_code_")
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), name))  # removed on the host


def test_stdin_and_exit_builtin():
    res = run("n = int(input())\nprint(n * 2)\nexit(0)", "21\n")
    assert (res.status, res.stdout) == ("ok", "42\n")


@pytest.mark.parametrize("code,status", [
    ("def f(:\n  pass", "syntax_error"),
    ("1 / 0", "error"),
    ("import sys\nsys.exit(3)", "error"),
    ("x = bytearray(10 * 2**30)", "memory"),
])
def test_failures(code, status):
    res = run(code)
    assert res.status == status
    assert res.wall_s < FAST.wall_s + SLACK_S


@pytest.mark.parametrize("code", ["while True:\n    pass", "import time\ntime.sleep(100)"])
def test_timeout_is_bounded(code):
    t0 = time.monotonic()
    res = run(code)
    assert res.status == "timeout"
    assert time.monotonic() - t0 < FAST.wall_s + SLACK_S
    assert no_sandbox_processes()


def test_output_limit_is_bounded():
    t0 = time.monotonic()
    res = run("while True:\n    print('x' * 1000)")
    assert res.status == "output_limit"
    assert len(res.stdout) <= FAST.output_bytes
    assert time.monotonic() - t0 < FAST.wall_s + SLACK_S


@pytest.mark.parametrize("code", [
    "import os\nwhile True:\n    os.fork()",
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "import subprocess\nsubprocess.Popen(['sleep', '100'])",
    "import os\nos.system('sleep 100 &')",
    "import os\nif os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(100)",
    "import multiprocessing\nmultiprocessing.Process(target=print).start()",
])
def test_processes_die_with_the_run(code):
    res = run(code)
    assert res.wall_s < FAST.wall_s + SLACK_S
    assert no_sandbox_processes()


def test_fork_bomb_reward_is_zero():
    out = code_reward(fenced("import os\nwhile True:\n    os.fork()"),
                      {"tests": [{"input": "", "output": "x"}]}, limits=FAST)
    assert out.score == 0.0
    assert no_sandbox_processes()


def test_host_files_are_invisible_and_unwritable(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    target = tmp_path / "written.txt"
    for code in [
        f"print(open({str(secret)!r}).read())",
        "print(open('/etc/shadow').read())",
        "print(open('../' * 8 + 'etc/passwd').read())",
        f"open({str(target)!r}, 'w').write('x')",
        f"import os\nos.remove({str(secret)!r})",
        "import os\nfd = os.open(os.path.dirname(os.__file__), os.O_RDONLY)\n"
        "os.open('zz_sandbox_test.py', os.O_WRONLY | os.O_CREAT, dir_fd=fd)",
    ]:
        res = run(code)
        assert res.status == "error", (code, res)
        assert "s3cret" not in res.stdout
    assert not target.exists() and secret.read_text() == "s3cret"
    listing = run("import os\nprint(sorted(os.listdir('/root')), os.path.exists('/etc'))")
    assert listing.stdout.split()[-1] == "False"  # no /etc at all; /root holds at most the
    assert set(ast.literal_eval(listing.stdout.rsplit(" ", 1)[0])) <= {".pyenv"}  # Python
    assert not os.path.exists(os.path.join(os.path.dirname(os.__file__), "zz_sandbox_test.py"))


def test_files_inside_tmp_and_stdlib_work():
    res = run(
        "import tempfile, json, collections, heapq, fractions, decimal, threading\n"
        "open('a.txt', 'w').write('hi')\n"
        "fd, path = tempfile.mkstemp()\n"
        "print(open('a.txt').read(), path.startswith(tempfile.gettempdir()))"
    )
    assert (res.status, res.stdout) == ("ok", "hi True\n")


@pytest.mark.parametrize("code", [
    "import os\nos.kill(1, 9)",
    "import os\nos.kill(os.getppid(), 9)",
    "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
    "import os\nos.setuid(0)",
    "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)",
])
def test_privileged_calls_fail(code):
    assert run(code).status == "error"


def test_calls_return_plain_values():
    add = "def add(a, b):\n    return a + b\n"
    res = run(add + "import sys\nsys.exit(0)", calls=["add(1, 2)", "add('a', 'b')", "1/0"])
    assert res.status == "ok"
    assert res.results == [["ok", {"t": "int", "v": "3"}], ["ok", {"t": "atom", "v": "ab"}],
                           ["raise", "ZeroDivisionError"]]
    assert run(add + "import os\nos._exit(0)", calls=["add(1, 2)"]).results is None


# ------------------------------------------------------------------------------- reward

STDIO = [{"input": "1 2\n", "output": "3\n"}, {"input": "5 5\n", "output": "10"},
         {"input": "2 2\n", "output": "4  \n\n"}]
ADD_STDIO = "a, b = map(int, input().split())\nprint(a + b)"
ASSERTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]


def reward(code, tests, **example):
    """(score, reason) of `code` in a python fence (None: a completion without code)."""
    completion = fenced(code) if code is not None else "no code"
    out = code_reward(completion, {"tests": tests, **example}, limits=FAST)
    return out.score, out.reason


def test_registered():
    assert get_reward("code") is code_reward


def test_correct_stdio_and_asserts():
    assert reward(ADD_STDIO, STDIO) == (1.0, None)
    assert reward("def add(a, b):\n    return a + b", ASSERTS) == (1.0, None)
    assert reward(ADD_STDIO, json.dumps(STDIO)) == (1.0, None)
    both = ("import sys\ndata = sys.stdin.read().split()\n"
            "if data:\n    print(int(data[0]) + int(data[1]))\n"
            "def add(a, b):\n    return a + b")
    assert reward(both, [STDIO[0], ASSERTS[0]]) == (1.0, None)
    assert reward(ADD_STDIO, [STDIO[0], ASSERTS[0]]) == (0.5, "error")  # EOF on input()


def test_partial_and_wrong():
    wrong_on_5 = "a, b = map(int, input().split())\nprint(a + b if a != 5 else 0)"
    assert reward(wrong_on_5, STDIO) == (pytest.approx(2 / 3), "wrong_output")
    add_wrong_below_0 = "def add(a, b):\n    return a * b if a < 0 else a + b"
    assert reward(add_wrong_below_0, ASSERTS) == (pytest.approx(2 / 3), "wrong_output")
    assert reward("print('nope')", STDIO) == (0.0, "wrong_output")


def test_reward_failure_reasons():
    assert reward(None, STDIO) == (0.0, "no_code")
    assert reward("def f(:", STDIO) == (0.0, "syntax_error")
    assert reward("raise ValueError", STDIO) == (0.0, "error")
    assert reward("x = 1\n" * 20_000, STDIO) == (0.0, "too_long")
    assert reward("print(open('/etc/passwd').read())", STDIO) == (0.0, "error")


def test_timeout_stops_early():
    t0 = time.monotonic()
    out = reward("while True:\n    pass", STDIO * 3)
    assert out == (0.0, "timeout")
    assert time.monotonic() - t0 < FAST.wall_s + SLACK_S


def test_limits_from_example():
    out = reward("import time\ntime.sleep(0.6)\nprint(3)", STDIO[:1], limits={"wall_s": 0.3})
    assert out == (0.0, "timeout")


def test_missing_or_bad_tests_raise():
    with pytest.raises(ValueError):
        code_reward(fenced("print(1)"), {"prompt": "p"})
    for bad in ([], "not json", [{"input": "1"}], [3]):
        with pytest.raises(ValueError):
            code_reward(fenced("print(1)"), {"tests": bad})


@settings(max_examples=25, deadline=None)
@given(st.text(max_size=60) | st.builds(lambda s: f"```python\n{s}\n```", st.text(max_size=40)))
def test_reward_never_raises(completion):
    out = code_reward(completion, {"tests": STDIO[:1]}, limits=FAST)
    assert 0.0 <= out.score <= 1.0
