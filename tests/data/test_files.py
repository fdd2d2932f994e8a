"""Tests for jaxrl_reason.data.files: GSM8K / MATH / generic JSONL and parquet sources."""
import importlib.util
import json
import sys

import ml_collections
import pytest

from jaxrl_reason.data import files
from jaxrl_reason.data.files import FieldMap, FileSource, field_map, read_examples
from jaxrl_reason.data.pipeline import example_iterator

HAS_PYARROW = importlib.util.find_spec("pyarrow") is not None
needs_pyarrow = pytest.mark.skipif(
    not HAS_PYARROW, reason="pyarrow is not installed (pip install 'jaxrl-reason[parquet]')"
)

GSM8K = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half "
        "as many clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = "
        "<<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {
        "question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 "
        "minutes of babysitting. How much did she earn?",
        "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she "
        "earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10",
    },
    {
        "question": "A factory makes 250 widgets a day. How many widgets does it make in 4 days?",
        "answer": "In 4 days it makes 250*4 = <<250*4=1000>>1,000 widgets.\n#### 1,000",
    },
]

MATH = [
    {
        "problem": "How many vertical asymptotes does the graph of $y=\\frac{2}{x^2+x-6}$ have?",
        "level": "Level 3",
        "type": "Algebra",
        "solution": "The denominator of the rational function factors into "
        "$x^2+x-6=(x-2)(x+3)$. Since the numerator is always nonzero, there is a vertical "
        "asymptote whenever the denominator is $0$, which occurs for $x = 2$ and $x = -3$.  "
        "Therefore, the graph has $\\boxed{2}$ vertical asymptotes.",
    },
    {
        "problem": "If $2x = 1$, what is $x$?",
        "level": "Level 1",
        "type": "Prealgebra",
        "solution": "Guess $\\boxed{1}$? No: dividing by 2, $x = \\boxed{\\frac{1}{2}}$.",
    },
    {
        "problem": "Simplify $\\sqrt{x^{4}}$ for $x>0$.",
        "level": "Level 2",
        "type": "Algebra",
        "solution": "$\\sqrt{x^{4}} = \\fbox{x^{2}}$.",
    },
]


def write_jsonl(path, records):
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def write_parquet(path, records, row_group_size=2):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), str(path), row_group_size=row_group_size)
    return str(path)


# ----------------------------------------------------------------------------- presets


def test_gsm8k_preset(tmp_path):
    path = write_jsonl(tmp_path / "gsm8k_train.jsonl", GSM8K)
    src = read_examples(path, fields="gsm8k")
    assert isinstance(src, FileSource) and len(src) == 3 and src.num_skipped == 0
    assert [e["answer"] for e in src] == ["72", "10", "1,000"]
    first = src[0]
    assert set(first) == {"id", "prompt", "answer", "solution"}
    assert first["id"] == "gsm8k_train-1"
    assert first["prompt"].startswith("Natalia sold clips to 48 of her friends in April")
    assert first["solution"] == (
        "Natalia sold 48/2 = 24 clips in May.\n"
        "Natalia sold 48+24 = 72 clips altogether in April and May."
    )
    assert src[1]["solution"].endswith("she earned 0.2 x 50 = $10.")
    assert "<<" not in src[2]["solution"] and "####" not in src[2]["solution"]


def test_math_preset_nested_and_last_box(tmp_path):
    path = write_jsonl(tmp_path / "math.jsonl", MATH)
    src = read_examples(path, fields="math")
    assert [e["answer"] for e in src] == ["2", "\\frac{1}{2}", "x^{2}"]
    assert src[0]["level"] == "Level 3" and src[0]["type"] == "Algebra"
    assert src[1]["solution"] == MATH[1]["solution"]
    assert src[1]["prompt"] == MATH[1]["problem"]
    assert "problem" not in src[1]


def test_generic_fields_number_answers_and_ids(tmp_path):
    path = write_jsonl(
        tmp_path / "mixed.jsonl",
        [{"question": "1+1?", "final": 2, "uid": 7, "src": "x"},
         {"question": "half of 1?", "final": 0.5, "uid": "b"}],
    )
    src = read_examples(path, fields={"prompt": "question", "answer": "final"}, id_field="uid")
    assert list(src) == [
        {"id": "7", "prompt": "1+1?", "answer": "2", "src": "x"},
        {"id": "b", "prompt": "half of 1?", "answer": "0.5"},
    ]


def test_preset_with_renamed_fields(tmp_path):
    records = [{"query": r["question"], "response": r["answer"]} for r in GSM8K]
    path = write_jsonl(tmp_path / "gsm.jsonl", records)
    src = read_examples(path, fields={"preset": "gsm8k", "prompt": "query", "answer": "response"})
    assert [e["answer"] for e in src] == ["72", "10", "1,000"]
    assert field_map("math") == FieldMap("math")
    assert field_map({"preset": "math", "prompt": ""}).prompt_field == "problem"
    assert field_map({"answer": "final"}).prompt_field == "prompt"
    config_fields = ml_collections.ConfigDict({"preset": "gsm8k", "prompt": "query", "answer": ""})
    assert field_map(config_fields) == FieldMap("gsm8k", prompt="query")


def test_option_errors(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", GSM8K)
    with pytest.raises(ValueError, match="unknown preset 'gsm9k'"):
        read_examples(path, fields="gsm9k")
    with pytest.raises(ValueError, match=r"unknown keys \['question'\]"):
        read_examples(path, fields={"question": "q"})
    with pytest.raises(ValueError, match="format must be"):
        read_examples(path, format="csv")
    with pytest.raises(ValueError, match="on_error must be"):
        read_examples(path, on_error="ignore")
    with pytest.raises(ValueError, match="unknown template 'r2'"):
        read_examples(path, fields="gsm8k", template="r2")
    other = tmp_path / "d.txt"
    other.write_text(json.dumps(GSM8K[0]) + "\n")
    with pytest.raises(ValueError, match=r"d\.txt: cannot tell the format.*format='jsonl'"):
        read_examples(str(other), fields="gsm8k")
    assert len(read_examples(str(other), format="jsonl", fields="gsm8k")) == 1
    with pytest.raises(FileNotFoundError):
        read_examples(str(tmp_path / "missing.jsonl"))


# ----------------------------------------------------------------------------- malformed records

GOOD = json.dumps({"prompt": "p", "answer": "a"})
NO_HASHES = "field 'answer' does not end with a '#### <answer>' line"
NO_BOX = r"field 'solution' has no \\boxed\{...\} answer"


@pytest.mark.parametrize(
    "bad_line, fields, message",
    [
        ('{"prompt": "p", "answer": ', "generic", "malformed JSON"),
        ('["prompt", "answer"]', "generic", "expected a JSON object, got list"),
        ('"just a string"', "generic", "expected a JSON object, got str"),
        ('{"prompt": "p"}', "generic", "missing field 'answer'"),
        ('{"prompt": 5, "answer": "a"}', "generic", "field 'prompt' must be a string"),
        ('{"prompt": "p", "answer": true}', "generic", "field 'answer' must be a string or a"),
        ('{"question": "q", "answer": "no marker"}', "gsm8k", NO_HASHES),
        ('{"question": "q", "answer": "x\\n#### "}', "gsm8k", NO_HASHES),
        ('{"question": "q", "answer": 72}', "gsm8k", "field 'answer' must be a string,"),
        ('{"problem": "p", "solution": "so x = 2."}', "math", NO_BOX),
        ('{"problem": "p", "solution": "\\\\boxed{}"}', "math", NO_BOX),
        ('{"problem": "p", "solution": "\\\\boxed{\\\\frac{1}{2}"}', "math", NO_BOX),
    ],
)
def test_malformed_record_names_file_and_line(tmp_path, bad_line, fields, message):
    good = {"generic": GOOD, "gsm8k": json.dumps(GSM8K[0]), "math": json.dumps(MATH[0])}[fields]
    path = write_jsonl(tmp_path / "data.jsonl", [good, "", good, bad_line, good])
    with pytest.raises(ValueError, match=rf"data\.jsonl:4: {message}") as raised:
        read_examples(path, fields=fields)
    src = read_examples(path, fields=fields, on_error="skip")
    assert len(src) == 3 and src.num_skipped == 1
    (where, reason), = src.skipped
    assert where == f"{path}:4" and str(raised.value) == f"{where}: {reason}"
    assert [e["id"] for e in src] == ["data-1", "data-3", "data-5"]


def test_skip_counts_several_kinds_and_non_utf8(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(
        b'{"prompt": "p1", "answer": "1"}\n'
        b'{"prompt": "\xff"}\n'
        b'not json\n'
        b'\n'
        b'{"prompt": "p5", "answer": 5}\n'
        b'{"answer": "6"}\n'
    )
    with pytest.raises(ValueError, match=r"mixed\.jsonl:2: not UTF-8"):
        read_examples(str(path))
    src = read_examples(str(path), on_error="skip")
    assert [e["prompt"] for e in src] == ["p1", "p5"]
    assert [where for where, _ in src.skipped] == [f"{path}:{n}" for n in (2, 3, 6)]
    assert "not UTF-8" in src.skipped[0][1] and "malformed JSON" in src.skipped[1][1]
    assert src.num_skipped == 3
    assert "3 skipped" in repr(src)


def test_empty_or_all_malformed_raises_even_when_skipping(tmp_path):
    empty = write_jsonl(tmp_path / "empty.jsonl", ["", "   "])
    with pytest.raises(ValueError, match=r"empty\.jsonl: no examples \(the file is empty"):
        read_examples(empty, on_error="skip")
    (tmp_path / "zero.jsonl").write_bytes(b"")
    with pytest.raises(ValueError, match="no examples"):
        read_examples(str(tmp_path / "zero.jsonl"))
    bad = write_jsonl(tmp_path / "bad.jsonl", ["{", '{"prompt": "p"}'])
    with pytest.raises(ValueError, match=r"all 2 records are malformed \(first: .*bad\.jsonl:1"):
        read_examples(bad, on_error="skip")


# ----------------------------------------------------------------------------- templates


def test_template_applied_while_reading(tmp_path):
    path = write_jsonl(tmp_path / "math.jsonl", MATH)
    src = read_examples(path, fields="math", template="boxed")
    assert src[0]["problem"] == MATH[0]["problem"]
    assert src[0]["prompt"] == MATH[0]["problem"] + (
        "\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    typed = read_examples(path, fields="math", template="({type}, {level}) {prompt}")
    assert typed[2]["prompt"] == "(Algebra, Level 2) " + MATH[2]["problem"]


def test_template_field_missing_from_a_record_is_a_malformed_record(tmp_path):
    records = [dict(MATH[0]), {k: v for k, v in MATH[1].items() if k != "type"}]
    path = write_jsonl(tmp_path / "math.jsonl", records)
    with pytest.raises(ValueError, match=r"math\.jsonl:2: template 'custom' uses field 'type'"):
        read_examples(path, fields="math", template="[{type}] {prompt}")
    src = read_examples(path, fields="math", template="[{type}] {prompt}", on_error="skip")
    assert len(src) == 1 and src.skipped[0][0] == f"{path}:2"


# ----------------------------------------------------------------------------- parquet


@needs_pyarrow
def test_parquet_round_trip_matches_jsonl(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "_PARQUET_BATCH_ROWS", 2)  # batches cross row groups
    records = MATH + MATH[:2]
    pq_path = write_parquet(tmp_path / "math_test.parquet", records, row_group_size=3)
    js_path = write_jsonl(tmp_path / "math_test.jsonl", records)
    from_pq = read_examples(pq_path, fields="math")
    from_js = read_examples(js_path, fields="math")
    assert [e["id"] for e in from_pq] == [f"math_test-{i}" for i in range(5)]
    strip = lambda src: [{k: v for k, v in e.items() if k != "id"} for e in src]  # noqa: E731
    assert strip(from_pq) == strip(from_js)


@needs_pyarrow
def test_parquet_generic_numbers_and_errors(tmp_path):
    rows = [{"q": f"{i}+1?", "a": i + 1} for i in range(5)]
    rows[3]["a"] = None  # a null answer: malformed
    path = write_parquet(tmp_path / "train.parquet", rows)
    fields = {"prompt": "q", "answer": "a"}
    with pytest.raises(ValueError, match=r"train\.parquet:row 3: field 'a' must be a string or"):
        read_examples(path, fields=fields)
    src = read_examples(path, fields=fields, on_error="skip")
    assert [e["answer"] for e in src] == ["1", "2", "3", "5"]
    assert src.skipped == [(f"{path}:row 3", "field 'a' must be a string or a number, got None")]
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"this is not parquet")
    with pytest.raises(ValueError, match=r"junk\.parquet: not a readable parquet file"):
        read_examples(str(junk))


@needs_pyarrow
def test_parquet_without_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "none.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string()),
                             "answer": pa.array([], pa.string())}), str(path))
    with pytest.raises(ValueError, match="no examples"):
        read_examples(str(path))


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow...` fail
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"pip install 'jaxrl-reason\[parquet\]'"):
        read_examples(str(path))


# ----------------------------------------------------------------------------- shards


@needs_pyarrow
def test_directory_and_glob_of_shards(tmp_path):
    shards = tmp_path / "gsm8k"
    shards.mkdir()
    write_jsonl(shards / "train-00001.jsonl", GSM8K[2:])
    write_parquet(shards / "train-00000.parquet", GSM8K[:2])
    (shards / "README.md").write_text("not data")
    src = read_examples(str(shards), fields="gsm8k")
    assert [e["answer"] for e in src] == ["72", "10", "1,000"]
    assert [e["id"] for e in src] == ["train-00000-0", "train-00000-1", "train-00001-1"]
    assert src.files == (str(shards / "train-00000.parquet"), str(shards / "train-00001.jsonl"))
    only_jsonl = read_examples(str(shards), format="jsonl", fields="gsm8k")
    assert [e["answer"] for e in only_jsonl] == ["1,000"]
    globbed = read_examples(str(shards / "train-*"), fields="gsm8k")
    assert list(globbed) == list(src)
    with pytest.raises(FileNotFoundError, match="no files match"):
        read_examples(str(shards / "test-*"), fields="gsm8k")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="directory holds no"):
        read_examples(str(tmp_path / "empty"))


def test_directory_errors_name_the_shard(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [GOOD])
    write_jsonl(tmp_path / "b.jsonl", [GOOD, "{oops"])
    with pytest.raises(ValueError, match=r"b\.jsonl:2: malformed JSON"):
        read_examples(str(tmp_path))
    assert read_examples(str(tmp_path), on_error="skip").skipped[0][0].endswith("b.jsonl:2")


# ----------------------------------------------------------------------------- pipeline


def test_file_source_in_example_iterator_resumes(tmp_path):
    records = [{"prompt": f"What is {i}+1?", "answer": i + 1} for i in range(11)]
    src = read_examples(write_jsonl(tmp_path / "arith.jsonl", records), template="r1")
    kwargs = dict(batch_size=3, seed=5)
    it = example_iterator(src, **kwargs)
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    expected = [[e["id"] for e in next(it)] for _ in range(3)]
    resumed = example_iterator(src, **kwargs)
    resumed.set_state(state)
    assert [[e["id"] for e in next(resumed)] for _ in range(3)] == expected
    batch = next(resumed)
    assert all(e["prompt"].endswith(f"User: {e['problem']}\nAssistant:") for e in batch)
    assert all(e["answer"] == str(int(e["problem"][8:-3]) + 1) for e in batch)
