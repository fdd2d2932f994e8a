"""The README and docs/: the results table is the one its JSON gives, the README stays a front
door (at most 300 lines), and every relative link resolves to a file."""

from __future__ import annotations

import copy
import importlib.util
import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "results_table.py"
README = ROOT / "README.md"


def _load_script():
    spec = importlib.util.spec_from_file_location("results_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rt = _load_script()


def _summary(mean: float, ci: float) -> dict:
    return {"mean": mean, "std": ci / 2, "ci95": ci, "values": [mean]}


def _eval_json(k: int = 4) -> dict:
    """An eval.json shaped like the one `jaxrl-reason train` writes (commands.train)."""
    def report(p1: float, length: float) -> dict:
        metrics = {"pass@1": _summary(p1, 0.02), f"maj@{k}": _summary(p1 + 0.05, 0.031),
                   f"pass@{k}": _summary(p1 + 0.2, 0.04), "mean_length": _summary(length, 0.55)}
        return {"sets": {"levels 1-3 (held-out)": metrics},
                "curves": {}, "config": {"num_samples": k, "seeds": [0, 1], "temperature": 1.0}}
    return {"reports": {"sft": report(0.5, 48.94), "rl": report(0.6234, 40.0)},
            "timings": {"sft_s": 100.4, "eval_before_s": 10.0, "rl_s": 200.0,
                        "eval_after_s": 11.0, "total_s": 330.0}}


def _run(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, text=True,
                          capture_output=True, check=False)


def test_render_block_rows_and_caption():
    block = rt.render_block(_eval_json(k=8), "runs/x/eval.json")
    lines = block.splitlines()
    assert lines[0].startswith("Produced by `jaxrl-reason train --config "
                               "configs/arith_grpo.py` (seed 0); the numbers are in "
                               "`runs/x/eval.json`. 8 samples per problem at temperature 1.0;"
                               " mean ± 95% t-interval over 2 sampling seeds.")
    assert lines[1] == ("Wall time 5.5 min (SFT 100 s, evaluation before 10 s, RL 200 s, "
                        "evaluation after 11 s).")
    assert "| checkpoint: eval set | pass@1 (%) | maj@8 (%) | pass@8 (%) | mean length " \
           "(tokens) |" in lines
    assert "| SFT: levels 1-3 (held-out) | 50.0 ± 2.0 | 55.0 ± 3.1 | 70.0 ± 4.0 | " \
           "48.9 ± 0.6 |" in lines
    assert "| RL: levels 1-3 (held-out) | 62.3 ± 2.0 | 67.3 ± 3.1 | 82.3 ± 4.0 | " \
           "40.0 ± 0.6 |" in lines


def test_missing_metric_names_its_place():
    data = _eval_json()
    del data["reports"]["rl"]["sets"]["levels 1-3 (held-out)"]["maj@4"]
    with pytest.raises(rt.ResultsError, match=r"reports\.rl\.sets\.levels 1-3 \(held-out\).*"
                                              r"'maj@4'"):
        rt.render_block(data, "e.json")


def test_mixed_sample_counts_refused():
    data = _eval_json()
    data["reports"]["rl"]["config"]["num_samples"] = 8
    with pytest.raises(rt.ResultsError, match="different numbers of samples"):
        rt.render_block(data, "e.json")


def test_eval_json_of_another_command_refused(tmp_path):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"checkpoint": "runs/a", "report": {}}))
    result = _run(str(path))
    assert result.returncode == 2
    assert "missing key 'reports'" in result.stderr and str(path) in result.stderr


def test_readme_table_is_the_one_its_json_gives():
    """The committed README's block names its JSON; re-rendering it from that JSON must give
    the block back byte for byte."""
    match = re.search(r"the numbers are in `([^`]+)`", README.read_text())
    assert match, "README's results block does not name its JSON"
    result = _run(match.group(1), "--check", "README.md")
    assert result.returncode == 0, result.stderr


def test_check_catches_an_edited_number_and_write_repairs_it(tmp_path):
    eval_path = tmp_path / "eval.json"
    eval_path.write_text(json.dumps(_eval_json()))
    doc = tmp_path / "README.md"
    doc.write_text(f"# t\n\n{rt.BEGIN}\nold\n{rt.END}\n\ntail\n")
    assert _run(str(eval_path), "--check", str(doc)).returncode == 1
    assert _run(str(eval_path), "--write", str(doc)).returncode == 0
    assert _run(str(eval_path), "--check", str(doc)).returncode == 0
    text = doc.read_text()
    assert text.startswith(f"# t\n\n{rt.BEGIN}\n") and text.endswith(f"{rt.END}\n\ntail\n")
    edited = text.replace("62.3 ± 2.0", "62.4 ± 2.0")
    assert edited != text
    doc.write_text(edited)
    result = _run(str(eval_path), "--check", str(doc))
    assert result.returncode == 1
    assert "62.3 ± 2.0" in result.stderr and "--write" in result.stderr
    # A changed JSON is caught too.
    changed = copy.deepcopy(_eval_json())
    changed["reports"]["sft"]["sets"]["levels 1-3 (held-out)"]["pass@1"]["mean"] = 0.51
    eval_path.write_text(json.dumps(changed))
    doc.write_text(text)
    assert _run(str(eval_path), "--check", str(doc)).returncode == 1


def test_seed_comes_from_the_runs_config(tmp_path):
    eval_path = tmp_path / "eval.json"
    eval_path.write_text(json.dumps(_eval_json()))
    assert rt.run_seed(str(eval_path), None) == 0
    assert rt.run_seed(str(eval_path), 5) == 5
    (tmp_path / "config.json").write_text(json.dumps({"name": "arith_grpo", "seed": 3}))
    assert rt.run_seed(str(eval_path), None) == 3
    result = _run(str(eval_path))
    assert result.returncode == 0 and "(seed 3)" in result.stdout
    result = _run(str(eval_path), "--seed", "4")
    assert result.returncode == 2 and "contradicts seed 3" in result.stderr


def test_missing_markers_are_reported(tmp_path):
    eval_path = tmp_path / "eval.json"
    eval_path.write_text(json.dumps(_eval_json()))
    doc = tmp_path / "doc.md"
    doc.write_text("# no table here\n")
    result = _run(str(eval_path), "--check", str(doc))
    assert result.returncode == 2 and rt.BEGIN in result.stderr and str(doc) in result.stderr


def test_readme_is_a_front_door():
    assert len(README.read_text().splitlines()) <= 300


def _markdown_files() -> list[pathlib.Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a markdown text's headings (lower case, punctuation dropped,
    spaces to hyphens), outside code blocks."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    """Every [text](target) that is not a URL names an existing file, and its #anchor (if
    any) a heading of that file."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        name, _, anchor = target.partition("#")
        path = (doc.parent / name).resolve() if name else doc
        if not path.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path.read_text()):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{doc.relative_to(ROOT)}: broken links: {broken}"


@pytest.mark.parametrize("doc", _markdown_files(), ids=lambda p: p.name)
def test_no_clock_times_dates_or_issue_numbers(doc):
    text = doc.read_text()
    patterns = {"a clock time": r"\b[0-2]\d:[0-5]\d\b", "a date": r"\b20\d\d-\d\d-\d\d\b",
                "an issue number": r"\b[Ii]ssue[- ]\d+", "'the day before'": r"day before"}
    found = {what: re.findall(p, text) for what, p in patterns.items()}
    assert not any(found.values()), f"{doc.name}: {found}"


def test_api_doc_imports_resolve():
    """Every `from jaxrl_reason... import ...` line of docs/api.md imports, so a moved
    module or a renamed function shows up here rather than in a user's traceback."""
    text = (ROOT / "docs" / "api.md").read_text()
    lines = [line.split("#")[0].strip() for block in re.findall(r"```python\n(.*?)```", text,
                                                                flags=re.S)
             for line in block.splitlines() if line.startswith("from jaxrl_reason")]
    assert len(lines) >= 10
    failures = []
    for line in lines:
        try:
            exec(line, {})  # noqa: S102 (the doc's own import lines)
        except ImportError as e:
            failures.append(f"{line}: {e}")
    assert not failures, "docs/api.md names imports that fail:\n" + "\n".join(failures)


def test_layout_tree_matches_the_package():
    """The README's annotated tree names every module and folder of `jaxrl_reason/`, and every
    `.py` file it names exists, so a moved module shows up here."""
    text = README.read_text()
    match = re.search(r"## Layout\n\n```\n(.*?)```", text, flags=re.S)
    assert match, "README has no Layout section with a tree"
    tree = match.group(1)
    package = ROOT / "jaxrl_reason"
    entries = [p.name + ("/" if p.is_dir() else "") for p in package.iterdir()
               if not p.name.startswith(("_", ".")) and (p.is_dir() or p.suffix == ".py")]
    unnamed = [e for e in entries if not re.search(rf"(?<![\w/]){re.escape(e)}", tree)]
    assert not unnamed, f"README's layout tree does not name: {sorted(unnamed)}"
    known = {p.name for base in ("jaxrl_reason", "kernels", "configs", "scripts", "tests")
             for p in (ROOT / base).rglob("*.py")}
    stale = sorted({name for name in re.findall(r"\b\w+\.py\b", tree)} - known)
    assert not stale, f"README's layout tree names files that do not exist: {stale}"


def test_tests_mirror_the_package():
    """Every subpackage of `jaxrl_reason/` (and `kernels/`) has its tests in the folder of the
    same name under `tests/`, and no test module sits at the top of `tests/` but these docs
    checks and the helpers' own tests."""
    packages = {p.name for p in (ROOT / "jaxrl_reason").iterdir()
                if p.is_dir() and (p / "__init__.py").exists()} | {"kernels"}
    missing = sorted(name for name in packages
                     if not list((ROOT / "tests" / name).glob("test_*.py")))
    assert not missing, f"subpackages without a tests/<name>/ folder of tests: {missing}"
    top = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    assert top == ["test_docs.py", "test_numerics.py"], top


def test_readme_verifier_accuracy_is_the_json_of_its_command():
    """The README's verifier figures are those of docs/verifier_accuracy.json, which the
    command named beside them wrote: on upstream labels (all, and without the disputed
    ones), ours beside math-verify alone; our own cases as a separate figure; the count of
    conventions, which are not scored."""
    data = json.loads((ROOT / "docs" / "verifier_accuracy.json").read_text())
    text = " ".join(README.read_text().split())
    assert data["command"] in text
    ours, alone = data["results"]["ours"], data["results"]["math-verify alone"]

    def pct(group: dict) -> str:
        return f"{100 * group['accuracy']:.1f}%"

    upstream = re.search(r"scored against upstream's own labels on the (\d+) public cases of "
                         r"Math-Verify's test files, is right on ([\d.]+%) \((\d+)\), against "
                         r"([\d.]+%) \((\d+)\) for math-verify alone", text)
    assert upstream, "README has no verifier accuracy on upstream labels"
    assert upstream.groups() == (
        str(ours["upstream"]["n"]), pct(ours["upstream"]), str(ours["upstream"]["correct"]),
        pct(alone["upstream"]), str(alone["upstream"]["correct"]))
    disputed = len(data["disputed"])
    undisputed = re.search(r"on the other (\d+) both are right on ([\d.]+%)", text)
    assert disputed == 1 and undisputed, "README must state the disputed label(s)"
    assert undisputed.groups() == (str(ours["upstream_undisputed"]["n"]),
                                   pct(ours["upstream_undisputed"]))
    assert pct(alone["upstream_undisputed"]) == undisputed.group(2)
    assert ours["upstream"]["correct"] >= alone["upstream"]["correct"] - disputed
    our_cases = re.search(r"On the (\d+) cases we wrote ourselves, a separate row, it is right "
                          r"on ([\d.]+%) against ([\d.]+%) for math-verify alone", text)
    assert our_cases, "README has no accuracy on our own cases"
    assert our_cases.groups() == (str(ours["ours"]["n"]), pct(ours["ours"]), pct(alone["ours"]))
    conventions = re.search(r"The (\d+) upstream cases whose verdict is a convention we chose",
                            text)
    assert conventions and int(conventions.group(1)) == len(data["conventions"])
    assert all(c["ours"] is c["convention_verdict"] for c in data["conventions"])


_FROM = re.compile(r"\bfrom\s+(jaxrl_reason(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n`#;\"')\\]+)")
_IMPORT = re.compile(r"\bimport\s+(jaxrl_reason(?:\.\w+)*)")
_NAME = re.compile(r"(\w+)(?:\s+as\s+\w+)?")
_CHECK = """
import importlib, json, sys
failures = []
for where, module, names in json.loads(sys.stdin.read()):
    try:
        mod = importlib.import_module(module)
    except Exception as e:
        failures.append(f"{where}: {module}: {type(e).__name__}: {e}")
        continue
    for name in names:
        if not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                failures.append(f"{where}: {module} has no {name!r}")
print(json.dumps(failures))
"""


def _imports_in(text: str, where: str, first_line: int = 1) -> list[tuple[str, str, list]]:
    """[(`where`:line, module, [names])] of the `from jaxrl_reason... import a, b as c` and
    `import jaxrl_reason.x` statements in `text` (parenthesized lists, `;`-joined and
    quoted one-liners included). A name list that is not identifiers (`as` aliases allowed)
    gets the name "<unparsed: ...>", which no module has."""
    found = []
    for match in _FROM.finditer(text):
        line = first_line + text.count("\n", 0, match.start())
        names = []
        for part in match.group(2).strip("() \t\n").split(","):
            part = part.strip()
            if part:
                m = _NAME.fullmatch(part)
                names.append(m.group(1) if m else f"<unparsed: {part}>")
        found.append((f"{where}:{line}", match.group(1), names))
    for match in _IMPORT.finditer(text):
        line = first_line + text.count("\n", 0, match.start())
        found.append((f"{where}:{line}", match.group(1), []))
    return found


def _quoted_imports() -> list[tuple[str, str, list]]:
    """The import statements of README.md and docs/*.md, and those inside string literals
    (docstrings aside) of benchmarks/*.py and tests/**/*.py: code these pass to
    subprocesses."""
    import ast
    found = []
    for doc in _markdown_files():
        found += _imports_in(doc.read_text(), str(doc.relative_to(ROOT)))
    for path in sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                           ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in docstrings:
                found += _imports_in(node.value, str(path.relative_to(ROOT)), node.lineno)
    return found


def test_quoted_imports_resolve():
    """Every `from jaxrl_reason.m import X` / `import jaxrl_reason.m` in the README, docs/ and
    the code strings of benchmarks/ and tests/ imports m and finds X (an attribute or a
    submodule), in one subprocess. Two wrong statements ride along to show the check fails."""
    wrong = [("<wrong name>", "jaxrl_reason.rewards", ["no_such_reward_fn"]),
             ("<wrong module>", "jaxrl_reason.no_such_module", [])]
    statements = _quoted_imports()
    assert len(statements) >= 20, statements
    proc = subprocess.run([sys.executable, "-c", _CHECK], input=json.dumps(statements + wrong),
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert failures[-2:] == [
        "<wrong name>: jaxrl_reason.rewards has no 'no_such_reward_fn'",
        "<wrong module>: jaxrl_reason.no_such_module: ModuleNotFoundError: No module named "
        "'jaxrl_reason.no_such_module'"], failures
    assert not failures[:-2], "imports that fail:\n" + "\n".join(failures[:-2])


LVT_DOC = ROOT / "docs" / "learning_vs_trl.md"
LVT_JSON = ROOT / "docs" / "learning_vs_trl.json"


def _lvt_figures(data: dict) -> dict[str, set[str]]:
    """The figures docs/learning_vs_trl.json gives, as the docs print them: "decimals"
    (pass@1 and batch correctness to 3 places, load averages to 2, the gain over the SFT
    start in points to 1) and "seconds" (wall times, whole seconds)."""
    curves = data["curves"]
    pass1 = [p for side in curves.values() for p in side["pass1"]]
    pass1 += [data["ours_final_pass1"], data["trl_final_pass1"]]
    decimals = {f"{p[k]:.3f}" for p in pass1 for k in ("mean", "low", "high")}
    for side in ("ours", "trl"):
        values = [v for seed in data["train_batch_correctness"]["by_seed"].values()
                  for v in seed[side]]
        decimals.add(f"{sum(values) / len(values):.3f}")
    loads = data["load_average"]
    decimals |= {f"{x:.2f}" for x in [*loads["plan"], *sum(loads["after_trl_runs"], [])]}
    sft = curves["ours"]["pass1"][0]["mean"]
    final = data["ours_final_pass1"]
    decimals |= {f"{100 * (final[k] - sft):.1f}" for k in ("mean", "low", "high")}
    walls = [w for side in curves.values() for w in side["wall_s"]]
    walls += [data["ours_total_s"], data["trl_total_s"]]
    seconds = {f"{w[k]:.0f}" for w in walls for k in ("mean", "low", "high")}
    seconds.add(f"{data['ours_s_to_trl_final']:.0f}")
    return {"decimals": decimals, "seconds": seconds}


def _lvt_limit() -> str:
    spec = importlib.util.spec_from_file_location("lvt_for_docs",
                                                  ROOT / "benchmarks" / "learning_vs_trl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return f"{module.LOAD_LIMIT_PER_CORE}"


def test_learning_vs_trl_comparison_figures_are_its_json():
    """Every figure of docs/learning_vs_trl.md's comparison (code blocks aside) comes from
    docs/learning_vs_trl.json: its table is the one the JSON gives, every decimal number is
    one of the JSON's figures (or the load limit of the script, or the README table's own
    figure, checked against the README), every "N s" one of its wall times, and the TRL
    virtualenv's versions are those it records."""
    data = json.loads(LVT_JSON.read_text())
    text = LVT_DOC.read_text()
    section = text[text.index("## The comparison"):]
    prose = " ".join(re.sub(r"```.*?```", "", section, flags=re.S).split())
    curves = data["curves"]

    def p1(p, bold=False):
        if p["low"] is None or p["high"] - p["low"] < 5e-4:
            return f"{p['mean']:.3f}"
        cell = f"{p['mean']:.3f} ({p['low']:.3f}-{p['high']:.3f})"
        return f"**{cell}**" if bold else cell

    def wall(w, last):
        return f"{w['mean']:.0f} ({w['low']:.0f}-{w['high']:.0f})" if last else \
            f"{w['mean']:.0f}"

    assert curves["ours"]["steps"] == curves["trl"]["steps"] == [0, 50, 100, 150, 200]
    rows = ["| ours | " + " | ".join(p1(p, i == 4) for i, p in
                                      enumerate(curves["ours"]["pass1"])) + " |",
            "| TRL `GRPOTrainer` | " + " | ".join(p1(p, i == 4) for i, p in
                                                   enumerate(curves["trl"]["pass1"])) + " |",
            "| ours, wall time under load (s) | " + " | ".join(
                wall(w, i == 4) for i, w in enumerate(curves["ours"]["wall_s"])) + " |",
            "| TRL, wall time under load (s) | " + " | ".join(
                wall(w, i == 4) for i, w in enumerate(curves["trl"]["wall_s"])) + " |"]
    missing = [row for row in rows if row not in section]
    assert not missing, f"docs/learning_vs_trl.md: table rows not as the JSON gives: {missing}"

    for name, version in data["versions"]["trl"].items():
        if name in ("torch", "transformers", "trl", "accelerate", "datasets", "math-verify"):
            assert f"{name} {version}" in prose, f"{name} {version}"
            prose = prose.replace(f"{name} {version}", name)
    readme_figure = re.search(r"\((\d+\.\d) ± (\d+\.\d) on its own evaluation set\)", prose)
    assert readme_figure, "the README table's figure is not quoted as expected"
    assert f"| {readme_figure.group(1)} ± {readme_figure.group(2)} |" in README.read_text()

    figures = _lvt_figures(data)
    allowed = figures["decimals"] | {_lvt_limit(), *readme_figure.groups()}
    stray = sorted(set(re.findall(r"\d+\.\d+", prose)) - allowed)
    assert not stray, f"docs/learning_vs_trl.md quotes figures not in its JSON: {stray}"
    stray_s = sorted(set(re.findall(r"\b(\d+) s\b", prose)) - figures["seconds"])
    assert not stray_s, f"docs/learning_vs_trl.md quotes times not in its JSON: {stray_s}"
    for total in ("ours_total_s", "trl_total_s"):
        t = data[total]
        assert f"{t['mean']:.0f} s ({t['low']:.0f}-{t['high']:.0f})" in prose, total
    # "The intervals overlap at every checkpoint".
    assert "overlap at every checkpoint" in prose
    for ours, trl in zip(curves["ours"]["pass1"][1:], curves["trl"]["pass1"][1:]):
        assert ours["low"] <= trl["high"] and trl["low"] <= ours["high"], (ours, trl)
    # What the JSON cannot back is gone: per-seed figures, the thread claims, an idle core.
    for claim in ("default of 2", "check at 1 thread", "ran nothing else", "OMP_NUM_THREADS"):
        assert claim not in section, claim


def test_readme_trl_paragraph_is_learning_vs_trl_json():
    """The README's TRL paragraph: seeds, steps, final pass@1 with intervals, the two wall
    times, and the load averages' range, all from docs/learning_vs_trl.json."""
    data = json.loads(LVT_JSON.read_text())
    text = README.read_text()
    start = text.index("Against TRL's `GRPOTrainer` on the same recipe")
    para = " ".join(text[start:text.index("\n\n", start)].split())
    final = [data["ours_final_pass1"], data["trl_final_pass1"]]
    loads = [*data["load_average"]["plan"], *sum(data["load_average"]["after_trl_runs"], [])]
    expected = {
        "seeds x steps": f"{len(data['seeds'])} training seeds × {data['steps']} steps",
        "pass@1": "held-out pass@1 at step {} is {} here and {} in TRL".format(
            data["steps"], *(f"{p['mean']:.3f} ({p['low']:.3f}-{p['high']:.3f})"
                             for p in final)),
        "wall times": f"{data['ours_total_s']['mean']:.0f} s here and "
                      f"{data['trl_total_s']['mean']:.0f} s in TRL",
        "load": f"load averages {min(loads):.2f} to {max(loads):.2f}",
        "threads": "TRL at 2 torch threads",
    }
    missing = {what: s for what, s in expected.items() if s not in para}
    assert not missing, f"README's TRL paragraph lacks, as its JSON gives them: {missing}"
    allowed = _lvt_figures(data)["decimals"]
    stray = sorted(set(re.findall(r"\d+\.\d+", para)) - allowed)
    assert not stray, f"README's TRL paragraph quotes figures not in the JSON: {stray}"


def test_packing_speed_figures_are_its_json():
    """docs/packing.md's Speed section quotes only docs/packing_speed.json, the file its
    command wrote: every decimal figure (times, load averages, ratios) is one of the JSON's
    (the 2.5x target aside)."""
    data = json.loads((ROOT / "docs" / "packing_speed.json").read_text())
    result = data["result"]
    pk = result["packing"]
    values = [*result["loadavg_start"], *result["loadavg_end"], pk["padded_s"], pk["packed_s"],
              *pk["padded_s_per_step"], *pk["packed_s_per_step"], pk["speedup"]]
    allowed = {f"{v:.2f}" for v in values} | {f"{v:g}" for v in values} | {"2.5"}
    allowed.add(f"{pk['padded_flops_per_useful_token'] / pk['packed_flops_per_useful_token']:.1f}")
    text = (ROOT / "docs" / "packing.md").read_text()
    section = text[text.index("## Speed"):text.index("## Measured equality")]
    assert "([packing_speed.json](packing_speed.json))" in section
    stray = sorted(set(re.findall(r"\d+\.\d+", section)) - allowed)
    assert not stray, f"docs/packing.md's Speed section quotes figures not in its JSON: {stray}"
    assert f"`pack_buckets` {pk['pack_buckets']}" in section.replace("\n", " ")


def _long_tail_of_record() -> dict:
    """The newest invocation in docs/speed_long_tail.json of the README's long-tail command
    with rows stopped by their stop id (the earlier ones gave rows their lengths as budgets)."""
    data = json.loads((ROOT / "docs" / "speed_long_tail.json").read_text())
    eos = [inv for inv in data["invocations"]
           if inv["runs"].get("ours.long_tail.bench-tiny", {}).get("stops") == "eos"]
    assert eos, "speed_long_tail.json has no run with rows stopped by their stop id"
    return eos[-1]


def test_readme_long_tail_figures_are_its_json():
    """The README's long-tail sampler rows quote the newest EOS-stopped, row-order invocation
    of `LONG_TAIL=1 taskset -c 1 bash benchmarks/compare.sh` in docs/speed_long_tail.json:
    every ratio, the occupancy and the KV-cache ratio, and the budgets-known row labelled as
    such."""
    inv = _long_tail_of_record()
    assert inv["command"] == "LONG_TAIL=1 taskset -c 1 bash benchmarks/compare.sh"
    ours = inv["runs"]["ours.long_tail.bench-tiny"]
    assert (ours["stops"], ours["queue"]) == ("eos", "row_order")
    text = README.read_text()
    section = text[text.index("Speed on long-tailed rollouts"):text.index("## Layout")]
    rate = ours["useful_tok_s"]
    expected = [f"{ours['speedup_vs_static']:.2f}×",
                f"KV cache {ours['kv_cache_bytes'] / ours['static_kv_cache_bytes']:.2f}×",
                f"{100 * ours['slot_occupancy']:.1f}%",
                f"{100 * ours['static_slot_occupancy']:.1f}%", f"{ours['slots']} slots"]
    for tag in ("anchor.tunix_sampler.long_tail", "anchor.hf_generate.long_tail",
                "anchor.hf_continuous_batching.long_tail"):
        expected.append(f"{rate / inv['runs'][tag]['useful_tok_s']:.2f}×")
    known = ours["budgets_known_in_advance"]
    expected += [f"{known['speedup_vs_static']:.2f}×", f"{100 * known['slot_occupancy']:.1f}%"]
    for figure in expected:
        assert figure in section, f"README long-tail section lacks {figure!r} from its JSON"
    assert "budgets known in advance" in section and "row order" in section
    loads = [float(line.split()[1]) for line in inv["loadavg"]]
    assert max(loads) <= 1.5  # taken on a quiet machine (compare.sh refuses above 1.5)


def test_guard_cost_figures_are_their_json():
    """docs/security.md's guard-cost table and ratios quote only
    docs/verifier_speed_guard.json, the file its command wrote."""
    data = json.loads((ROOT / "docs" / "verifier_speed_guard.json").read_text())
    text = (ROOT / "docs" / "security.md").read_text()
    section = text[text.index("What the guards cost"):text.index("## Tool results")]
    assert f"`{data['command']}`" in section.replace("\n", " ")
    assert not data["quiet_check"]["load_check_waived"]
    assert f"{data['quiet_check']['load_average_1_5_15_min'][0]:.2f}" in section
    rows = {(r["verifier"], r["workers"]): r for r in data["rows"]}
    for w in (1, 2, 4):
        now, old = rows[("current", w)], rows[("old 5d86af3", w)]
        row = (f"| {w} | {now['answers_per_s']:,.0f} / {old['answers_per_s']:,.0f} | "
               f"{now['cached_answers_per_s']:,.0f} / {old['cached_answers_per_s']:,.0f} | "
               f"{now['adversarial_batch_s']:.2f} / {old['adversarial_batch_s']:.2f} |")
        assert row in section, row
    for key, word in (("answers_per_s", "cold"), ("cached_answers_per_s", "cached")):
        ratios = [r[key] for r in data["current_vs_old"]]
        assert f"×{min(ratios):.2f} to ×{max(ratios):.2f} {word}" in section, key


def _seed_runs(tmp_path, p1s=(0.5, 0.52, 0.47)) -> list[str]:
    """eval.json files of runs with training seeds 0, 1, 2 (config.json beside each)."""
    paths = []
    for seed, p1 in enumerate(p1s):
        run = tmp_path / f"seed{seed}"
        run.mkdir()
        data = _eval_json()
        data["reports"]["sft"]["sets"]["levels 1-3 (held-out)"]["pass@1"]["mean"] = p1
        (run / "eval.json").write_text(json.dumps(data))
        (run / "config.json").write_text(json.dumps({"seed": seed}))
        paths.append(str(run / "eval.json"))
    return paths


def test_several_training_seeds_give_mean_and_t_interval(tmp_path):
    """A cell over training seeds is the mean of the runs' means ± t_{0.975, m-1} s / sqrt(m)
    (t_{0.975, 2} = 4.302653), and each seed's pass@1 is stated."""
    import numpy as np

    paths = _seed_runs(tmp_path)
    saved = tmp_path / "seeds.json"
    result = _run(*paths, "--save", str(saved))
    assert result.returncode == 0, result.stderr
    values = np.array([0.5, 0.52, 0.47])
    half = 4.302653 * values.std(ddof=1) / np.sqrt(3)
    cell = f"{100 * values.mean():.1f} ± {100 * half:.1f}"
    assert f"| SFT: levels 1-3 (held-out) | {cell} |" in result.stdout
    assert "SFT 50.0, 52.0, 47.0; RL 62.3, 62.3, 62.3" in result.stdout
    assert "| RL: levels 1-3 (held-out) | 62.3 ± 0.0 |" in result.stdout  # no spread
    assert "for S = 0, 1, 2" in result.stdout
    # The saved file renders the same block (naming itself) and checks a document.
    doc = tmp_path / "README.md"
    doc.write_text(f"{rt.BEGIN}\n{rt.END}\n")
    assert _run(str(saved), "--write", str(doc)).returncode == 0
    assert _run(str(saved), "--check", str(doc)).returncode == 0
    assert f"the numbers are in `{saved}`" in doc.read_text()


def test_runs_that_are_not_seeds_of_one_recipe_are_refused(tmp_path):
    paths = _seed_runs(tmp_path)
    result = _run(paths[0], paths[0])
    assert result.returncode == 2 and "training seeds repeat ([0, 0])" in result.stderr
    other = json.loads(pathlib.Path(paths[2]).read_text())
    other["reports"]["rl"]["config"]["num_samples"] = 8
    pathlib.Path(paths[2]).write_text(json.dumps(other))
    result = _run(*paths)
    assert result.returncode == 2 and paths[2] in result.stderr
    result = _run(*paths[:2], "--check", "README.md")
    assert result.returncode == 2 and "--save them to one file" in result.stderr
