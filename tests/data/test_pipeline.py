"""Tests for jaxrl_reason.data.pipeline: batching, epochs, shards, resume, JSONL."""
import json
from collections import Counter

import pytest

from jaxrl_reason.data.pipeline import example_iterator, jsonl_source


def make_source(n):
    return [
        {"id": f"a-{i}", "prompt": f"What is {i}+1?", "answer": str(i + 1), "level": i % 3}
        for i in range(n)
    ]


def ids(batch):
    return [example["id"] for example in batch]


def take(it, n):
    return [ids(next(it)) for _ in range(n)]


def test_batches_are_lists_of_python_dicts():
    src = make_source(10)
    batch = next(example_iterator(src, batch_size=4, seed=0))
    assert isinstance(batch, list) and len(batch) == 4
    for example in batch:
        assert type(example) is dict
        assert type(example["prompt"]) is str and type(example["level"]) is int
        assert example == src[int(example["id"][2:])]
    batch[0]["prompt"] = "mutated"
    assert all(e["prompt"] != "mutated" for e in src)


def test_one_epoch_covers_everything_once_and_shuffles():
    src = make_source(24)
    batches = list(example_iterator(src, batch_size=4, seed=3, num_epochs=1))
    seen = [i for b in batches for i in ids(b)]
    assert sorted(seen) == sorted(e["id"] for e in src)
    assert seen != [e["id"] for e in src]
    ordered = list(example_iterator(src, batch_size=4, seed=3, num_epochs=1, shuffle=False))
    assert [i for b in ordered for i in ids(b)] == [e["id"] for e in src]


def test_seed_determinism():
    src = make_source(30)
    a = take(example_iterator(src, batch_size=5, seed=7), 8)
    b = take(example_iterator(src, batch_size=5, seed=7), 8)
    c = take(example_iterator(src, batch_size=5, seed=8), 8)
    assert a == b and a != c


def test_forever_reshuffles_each_epoch():
    src = make_source(12)
    flat = [i for b in take(example_iterator(src, batch_size=4, seed=0), 9) for i in b]
    epochs = [flat[k * 12 : (k + 1) * 12] for k in range(3)]
    for epoch in epochs:
        assert sorted(epoch) == sorted(e["id"] for e in src)
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]


def test_remainder_handling():
    src = make_source(10)
    dropped = list(example_iterator(src, batch_size=4, seed=0, num_epochs=1))
    assert [len(b) for b in dropped] == [4, 4]
    kept = list(example_iterator(src, batch_size=4, seed=0, num_epochs=1, drop_remainder=False))
    assert [len(b) for b in kept] == [4, 4, 2]
    two = list(example_iterator(src, batch_size=4, seed=0, num_epochs=2))
    assert [len(b) for b in two] == [4] * 5
    assert Counter(i for b in two for i in ids(b)) == Counter({e["id"]: 2 for e in src})


@pytest.mark.parametrize("n", [40, 43])
def test_shards_are_disjoint_and_equal(n):
    src = make_source(n)
    count = 4
    per_shard = []
    for k in range(count):
        batches = list(
            example_iterator(
                src, batch_size=1, seed=1, num_epochs=1, shard_index=k, shard_count=count
            )
        )
        assert len(batches) == n // count  # equal shards: every process takes as many steps
        per_shard.append({i for b in batches for i in ids(b)})
    for k in range(count):
        assert len(per_shard[k]) == n // count
        for j in range(k):
            assert not per_shard[k] & per_shard[j]
    assert len(set().union(*per_shard)) <= n - n % count


def test_shards_disjoint_across_epochs():
    src = make_source(16)
    a = take(example_iterator(src, batch_size=4, seed=0, shard_index=0, shard_count=2), 6)
    b = take(example_iterator(src, batch_size=4, seed=0, shard_index=1, shard_count=2), 6)
    assert not {i for x in a for i in x} & {i for x in b for i in x}


@pytest.mark.parametrize("num_epochs", [None, 5])
def test_resume_reproduces_batches(num_epochs):
    src = make_source(13)
    kwargs = dict(batch_size=3, seed=11, num_epochs=num_epochs, shard_index=1, shard_count=2)
    it = example_iterator(src, **kwargs)
    take(it, 5)
    state = json.loads(json.dumps(it.get_state()))  # survives a JSON round-trip
    expected = take(it, 3)
    resumed = example_iterator(src, **kwargs)
    resumed.set_state(state)
    assert take(resumed, 3) == expected
    fresh = take(example_iterator(src, **kwargs), 8)
    assert fresh[5:] == expected


def test_example_iterator_errors():
    src = make_source(6)
    with pytest.raises(ValueError, match="batch_size"):
        example_iterator(src, batch_size=0, seed=0)
    with pytest.raises(ValueError, match="shard_index"):
        example_iterator(src, batch_size=1, seed=0, shard_index=2, shard_count=2)
    with pytest.raises(ValueError, match="seed"):
        example_iterator(src, batch_size=1, seed=-1)
    with pytest.raises(ValueError, match="num_epochs"):
        example_iterator(src, batch_size=1, seed=0, num_epochs=0)
    with pytest.raises(ValueError, match="fewer than shard_count"):
        example_iterator(src, batch_size=1, seed=0, shard_count=7)
    with pytest.raises(ValueError, match="no batch"):
        example_iterator(src, batch_size=7, seed=0, num_epochs=1)
    with pytest.raises(TypeError, match="len"):
        example_iterator(iter(src), batch_size=1, seed=0)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        example_iterator(src, batch_size=2.0, seed=0)
    it = example_iterator(["not a dict"] * 4, batch_size=2, seed=0)
    with pytest.raises(TypeError, match=r"source\[\d\] is str"):
        next(it)


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_jsonl_source_reads_and_renames(tmp_path):
    path = write_lines(
        tmp_path / "gsm.jsonl",
        [
            json.dumps({"question": "1+1?", "final": 2, "uid": 17, "level": 1}),
            "",
            json.dumps({"question": "caf\u00e9?", "final": "x=3", "uid": "b", "level": 2}),
        ],
    )
    rows = jsonl_source(path, prompt_field="question", answer_field="final", id_field="uid")
    assert rows == [
        {"id": "17", "prompt": "1+1?", "answer": "2", "level": 1},
        {"id": "b", "prompt": "caf\u00e9?", "answer": "x=3", "level": 2},
    ]
    default_ids = jsonl_source(path, prompt_field="question", answer_field="final")
    assert [r["id"] for r in default_ids] == ["gsm-1", "gsm-3"]
    batch = next(example_iterator(rows, batch_size=2, seed=0))
    assert sorted(ids(batch)) == ["17", "b"]


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ('{"prompt": "p", "answer": ', "malformed JSON"),
        ('["prompt", "answer"]', "expected a JSON object"),
        ('{"prompt": "p"}', "missing field 'answer'"),
        ('{"answer": "a"}', "missing field 'prompt'"),
        ('{"prompt": 5, "answer": "a"}', "field 'prompt' must be a string"),
        ('{"prompt": "p", "answer": null}', "field 'answer' must be a string or a number"),
    ],
)
def test_jsonl_source_errors_name_file_and_line(tmp_path, bad_line, message):
    good = json.dumps({"prompt": "p", "answer": "a"})
    path = write_lines(tmp_path / "data.jsonl", [good, good, bad_line, good])
    with pytest.raises(ValueError, match=rf"data\.jsonl:3: {message}"):
        jsonl_source(path)


def test_jsonl_source_empty_and_missing(tmp_path):
    path = write_lines(tmp_path / "empty.jsonl", ["", "  "])
    with pytest.raises(ValueError, match="no examples"):
        jsonl_source(path)
    with pytest.raises(FileNotFoundError):
        jsonl_source(str(tmp_path / "missing.jsonl"))
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b'{"prompt": "p", "answer": "a"}\n{"prompt": "\xff"}\n')
    with pytest.raises(ValueError, match=r"binary\.jsonl:2: not UTF-8"):
        jsonl_source(str(binary))
