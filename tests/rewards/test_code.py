"""Tests for code extraction, the sandboxed runner and the `code` reward.

Every sandboxed run starts a Python process (~50 ms); the limits below keep the timeouts
short so the whole file runs in a few seconds.
"""
import json
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_reason.rewards import get_reward
from jaxrl_reason.rewards.code import (
    SandboxLimits,
    code_reward,
    extract_code,
    run_sandboxed,
)

FAST = SandboxLimits(wall_s=1.0, cpu_s=1.0, memory_bytes=256 * 2**20, output_bytes=4096)
SLACK_S = 1.5  # a killed run returns within its wall limit plus this


def run(code, stdin="", **kw):
    return run_sandboxed(code, stdin, FAST, **kw)


def fenced(code):
    return f"Here is my solution.\n```python\n{code}\n```\n"


def sandbox_processes():
    """Pids of live processes whose command line names a sandbox temp dir."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"jaxrl_code_" in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


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
    res = run("import os\nprint(os.getcwd())")
    assert res.status == "ok"
    assert res.wall_s < 1.0
    tmp = res.stdout.strip()
    assert "jaxrl_code_" in tmp and not os.path.exists(tmp)


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
    assert sandbox_processes() == []


def test_output_limit_is_bounded():
    t0 = time.monotonic()
    res = run("while True:\n    print('x' * 1000)")
    assert res.status == "output_limit"
    assert len(res.stdout) <= FAST.output_bytes
    assert time.monotonic() - t0 < FAST.wall_s + SLACK_S


@pytest.mark.parametrize("code", [
    "import os\nwhile True:\n    os.fork()",
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "import subprocess\nsubprocess.run(['sleep', '100'])",
    "import os\nos.system('sleep 100 &')",
    "import os\nos.posix_spawn('/bin/sleep', ['sleep', '100'], {})",
    "import multiprocessing\nmultiprocessing.Process(target=print).start()",
    "import _imp, importlib.util\n"
    "_imp.create_dynamic(importlib.util.find_spec('_posixsubprocess'))",
])
def test_process_creation_is_blocked_and_nothing_survives(code):
    res = run(code)
    assert res.status == "blocked", res
    assert res.wall_s < FAST.wall_s + SLACK_S
    assert sandbox_processes() == []


def test_fork_bomb_reward_is_zero():
    out = code_reward(fenced("import os\nwhile True:\n    os.fork()"),
                      {"tests": [{"input": "", "output": ""}]}, limits=FAST)
    assert (out.score, out.reason) == (0.0, "blocked")


def test_file_access_outside_tmp_is_blocked(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    target = tmp_path / "written.txt"
    for code in [
        "print(open('/etc/passwd').read())",
        f"print(open({str(secret)!r}).read())",
        "print(open('../' * 8 + 'etc/passwd').read())",
        "import os\nprint(os.listdir('/'))",
        f"open({str(target)!r}, 'w').write('x')",
        f"import os\nos.close(os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT))",
        "open('../escape.txt', 'w').write('x')",
        f"import os\nos.remove({str(secret)!r})",
        "import os\nos.link('/etc/passwd', 'p')",
        "import os\nos.symlink('/etc/passwd', 'p')",
        "import os\nfd = os.open(os.path.dirname(os.__file__), os.O_RDONLY)\n"
        "os.open('zz_sandbox_test.py', os.O_WRONLY | os.O_CREAT, dir_fd=fd)",
    ]:
        res = run(code)
        assert res.status == "blocked", (code, res)
        assert "s3cret" not in res.stdout
    assert not target.exists() and secret.exists()


def test_files_inside_tmp_and_stdlib_work():
    res = run(
        "import tempfile, json, collections, heapq, fractions, decimal, threading\n"
        "open('a.txt', 'w').write('hi')\n"
        "fd, path = tempfile.mkstemp()\n"
        "print(open('a.txt').read(), path.startswith(tempfile.gettempdir()))"
    )
    assert (res.status, res.stdout) == ("ok", "hi True\n")


@pytest.mark.parametrize("code", [
    "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 22))",
    "import socket\nsocket.create_connection(('127.0.0.1', 80), timeout=1)",
    "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:1', timeout=1)",
    "import ctypes",
    "import os\nos.kill(1, 0)",
    "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
])
def test_network_signals_and_escapes_are_blocked(code):
    assert run(code).status == "blocked"


def test_hook_fires_even_if_caught():
    res = run("try:\n    open('/etc/passwd')\nexcept OSError:\n    pass\nprint('ok')")
    assert res.status == "blocked"


def test_hook_holds_across_threads():
    res = run(
        "import os, threading\nhits = []\n"
        "def spam():\n    for _ in range(2000):\n        try:\n"
        "            hits.append(open('/etc/passwd').read(4))\n"
        "        except OSError:\n            pass\n"
        "t = threading.Thread(target=spam)\nt.start()\n"
        "for _ in range(2000):\n    os.listdir('.')\nt.join()\nprint(len(hits))"
    )
    assert (res.status, res.stdout) == ("blocked", "0\n")


def test_asserts_run_after_solution_and_cannot_be_skipped():
    add = "def add(a, b):\n    return a + b\n"
    assert run(add, tests="assert add(1, 2) == 3").status == "ok"
    assert run(add, tests="assert add(1, 2) == 4").status == "error"
    # Exiting early does not skip the tests.
    assert run(add + "import sys\nsys.exit(0)", tests="assert add(1, 2) == 4").status == "error"
    assert run(add + "import os\nos._exit(0)", tests="assert add(1, 2) == 3").status == "error"


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
    assert reward(add_wrong_below_0, ASSERTS) == (pytest.approx(2 / 3), "error")
    assert reward("print('nope')", STDIO) == (0.0, "wrong_output")


def test_reward_failure_reasons():
    assert reward(None, STDIO) == (0.0, "no_code")
    assert reward("def f(:", STDIO) == (0.0, "syntax_error")
    assert reward("raise ValueError", STDIO) == (0.0, "error")
    assert reward("x = 1\n" * 20_000, STDIO) == (0.0, "too_long")
    assert reward("print(open('/etc/passwd').read())", STDIO) == (0.0, "blocked")


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
