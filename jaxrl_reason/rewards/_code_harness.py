"""The program that runs a code answer inside the sandbox (run by path, standard library only).

    python -I -S -B -X utf8 _code_harness.py '<json config>'

Config: `solution` (path of solution.py, read-only), `status_fd` (a pipe to the parent),
`calls` (None, or a list of Python expression sources whose values the parent wants).
It runs the solution as `__main__` (with `exit`/`quit`, which -S leaves undefined); with
`calls`, it then evaluates each expression in that namespace and writes one status line
`result <json>`: per call `["ok", <plain value>]` or `["raise", "<exception type>"]`.

A plain value is JSON of tagged data (`{"t": tag, "v": ...}`) for None, bool, int, float
(as repr, so inf/nan survive), str, bytes (hex), list, tuple, set, frozenset and dict of
plain values, checked by exact type; anything else (a subclass, an object with its own
`__eq__`) becomes `{"t": "object", "v": "<type name>"}`, which the parent never equates with
an expected value. The parent decodes it into fresh builtin objects and compares them with
the expected values, which never enter the sandbox. Other status lines: `syntax_error`,
`memory`. Everything this program does can be undone by the code it runs (same process); the
boundary is the OS sandbox around it, and the verdict is the parent's comparison.
"""
import json
import os
import sys
import types

_MAX_DEPTH = 50
_MAX_ITEMS = 100_000


def plain(value, depth=0, budget=None):
    """`value` as tagged JSON-able data (see the module docstring)."""
    budget = budget if budget is not None else [_MAX_ITEMS]
    budget[0] -= 1
    if depth > _MAX_DEPTH or budget[0] < 0:
        return {"t": "object", "v": "too large"}
    t = type(value)
    if value is None or t is bool or t is str:
        return {"t": "atom", "v": value}
    if t is int:
        return {"t": "int", "v": str(value)} if abs(value) < 10**4000 else \
            {"t": "object", "v": "huge int"}
    if t is float:
        return {"t": "float", "v": repr(value)}
    if t is bytes:
        return {"t": "bytes", "v": value.hex()}
    if t in (list, tuple, set, frozenset):
        items = sorted(value, key=repr) if t in (set, frozenset) else value
        return {"t": t.__name__, "v": [plain(x, depth + 1, budget) for x in items]}
    if t is dict:
        return {"t": "dict", "v": [[plain(k, depth + 1, budget), plain(v, depth + 1, budget)]
                                   for k, v in value.items()]}
    return {"t": "object", "v": t.__name__}


def main():
    cfg = json.loads(sys.argv.pop(1))

    def report(msg):
        try:
            os.write(cfg["status_fd"], (msg + "\n").encode())
        except OSError:
            pass

    try:
        with open(cfg["solution"], encoding="utf-8") as f:
            code = compile(f.read(), "solution.py", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError) as e:
        report("syntax_error")
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        os._exit(1)
    import builtins

    builtins.exit = builtins.quit = sys.exit
    sys.argv[:] = ["solution.py"]
    module = sys.modules["__main__"] = types.ModuleType("__main__")
    calls = cfg["calls"]
    try:
        try:
            exec(code, module.__dict__)
        except SystemExit:
            if calls is None:
                raise
        if calls is not None:
            results = []
            for source in calls:
                try:
                    results.append(["ok", plain(eval(source, module.__dict__))])
                except MemoryError:
                    raise
                except BaseException as e:  # noqa: BLE001 (the call's failure is its result)
                    results.append(["raise", type(e).__name__])
            sys.stdout.flush()
            report("result " + json.dumps(results))
    except MemoryError:
        report("memory")
        raise


if __name__ == "__main__":
    main()
