"""Prompt sets: round trips through every format, verl's layout, stable ids, every refusal."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cropi.data import (BadRowsError, PromptFileError, PromptRecord, load_prompts, prompts_fingerprint,
                        stable_prompt_id, write_jsonl, write_parquet, write_verl_parquet)
from cropi.errors import InvalidInputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _chat(text, system=None):
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [{"role": "user", "content": text}]


def _records():
    return [
        PromptRecord(prompt_id="a", prompt=_chat("What is 1+1?"), answer="2", data_source="toy/add",
                     extra_info={"level": 1, "tags": ["x", "y"], "meta": {"origin": "hand"}}),
        PromptRecord(prompt_id="b", prompt=_chat("Solve x^2=4, x>0.", system="Be brief."), answer="2",
                     data_source="toy/alg", extra_info={"level": 3}),
        PromptRecord(prompt_id="c", prompt=_chat("Half of one?"), answer="\\frac{1}{2}"),
    ]


def _write_jsonl_lines(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")


def _expected_id(prompt, answer):
    """The documented rule, written out independently of the library."""
    blob = json.dumps({"prompt": prompt, "answer": answer}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:16]


# ---------------------------------------------------------------- round trips


@pytest.mark.parametrize("writer,ext", [(write_jsonl, "jsonl"), (write_parquet, "parquet"),
                                        (write_verl_parquet, "parquet")])
def test_round_trip_every_format(tmp_path, writer, ext):
    records = _records()
    path = str(tmp_path / f"set.{ext}")
    writer(records, path)
    assert load_prompts(path) == records
    assert [p.name for p in tmp_path.iterdir()] == [f"set.{ext}"]  # no temporary file left behind


_values = {"level": st.integers(-5, 5), "name": st.text(max_size=5), "score": st.floats(-1, 1),
           "tags": st.lists(st.text(max_size=3), max_size=3)}
_extra = st.fixed_dictionaries({}, optional=_values)
_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                  "content": st.text(min_size=1).filter(str.strip)})
_record = st.builds(lambda pid, msgs, ans, src, extra: PromptRecord(prompt_id=pid, prompt=msgs, answer=ans,
                                                                     data_source=src, extra_info=extra),
                    st.text(min_size=1, max_size=8).filter(str.strip), st.lists(_message, min_size=1, max_size=3),
                    st.text(min_size=1, max_size=10).filter(str.strip), st.text(max_size=6), _extra)
_record_sets = st.lists(_record, min_size=1, max_size=6, unique_by=lambda r: r.prompt_id)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_record_sets)
def test_round_trip_random_records(tmp_path, records):
    for writer, name in ((write_jsonl, "r.jsonl"), (write_parquet, "r.parquet"), (write_verl_parquet, "v.parquet")):
        path = str(tmp_path / name)
        writer(records, path)
        assert load_prompts(path) == records, name


def test_text_prompts_round_trip_plainly_and_become_one_user_turn_in_verl(tmp_path):
    records = [PromptRecord(prompt_id=f"t{i}", prompt=f"What is {i}+{i}?", answer=str(2 * i)) for i in range(3)]
    for writer, name in ((write_jsonl, "t.jsonl"), (write_parquet, "t.parquet")):
        write_path = str(tmp_path / name)
        writer(records, write_path)
        assert load_prompts(write_path) == records
    write_verl_parquet(records, str(tmp_path / "v.parquet"))
    back = load_prompts(str(tmp_path / "v.parquet"))
    assert [r.prompt for r in back] == [[{"role": "user", "content": r.prompt}] for r in records]
    assert [r.prompt_id for r in back] == [r.prompt_id for r in records]


def test_none_values_are_the_same_as_missing_keys():
    r = PromptRecord(prompt_id="x", prompt=[{"role": "user", "content": "hi", "name": None}], answer="1",
                     extra_info={"a": None, "b": {"c": None, "d": 1}, "e": [{"f": None}]})
    assert r.prompt == [{"role": "user", "content": "hi"}]
    assert r.extra_info == {"b": {"d": 1}, "e": [{}]}


# ---------------------------------------------------------------- verl layout


def test_verl_layout_matches_verls_rlvr_rows(tmp_path):
    path = str(tmp_path / "stage.parquet")
    records = _records()
    write_verl_parquet(records, path, split="test")
    table = pq.read_table(path)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert table.schema.field("prompt").type == pa.list_(pa.struct([("role", pa.string()),
                                                                     ("content", pa.string())]))
    for i, (row, rec) in enumerate(zip(table.to_pylist(), records)):
        assert row["data_source"] == rec.data_source
        assert row["prompt"] == rec.prompt
        assert row["ability"] == "math"
        assert row["reward_model"] == {"style": "rule", "ground_truth": rec.answer}
        extra = {k: v for k, v in row["extra_info"].items() if v is not None}
        assert extra == {"split": "test", "index": i, "prompt_id": rec.prompt_id, **rec.extra_info}


def test_verl_writer_owns_split_index_and_prompt_id(tmp_path):
    rec = PromptRecord(prompt_id="mine", prompt="q?", answer="1", extra_info={"index": 99, "split": "x", "k": 1})
    path = str(tmp_path / "v.parquet")
    write_verl_parquet([rec], path)
    assert pq.read_table(path).to_pylist()[0]["extra_info"] == {"split": "train", "index": 0,
                                                               "prompt_id": "mine", "k": 1}
    assert load_prompts(path)[0].extra_info == {"k": 1}


def test_gsm8k_style_verl_file_takes_ids_from_index(tmp_path):
    # the row layout verl's examples/data_preprocess/gsm8k.py writes: no prompt_id, an index
    rows = [{"data_source": "openai/gsm8k", "prompt": _chat(f"Q{i} Let's think step by step."),
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(10 + i)},
             "extra_info": {"split": "train", "index": i, "answer": f"... #### {10 + i}", "question": f"Q{i}"}}
            for i in range(4)]
    path = str(tmp_path / "gsm8k.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    got = load_prompts(path)
    assert [r.prompt_id for r in got] == [str(i) for i in range(4)]
    assert [r.answer for r in got] == [str(10 + i) for i in range(4)]
    assert got[2].extra_info == {"answer": "... #### 12", "question": "Q2"}
    assert all(r.data_source == "openai/gsm8k" for r in got)


def test_verl_id_priority_prompt_id_then_extra_prompt_id_then_index_then_hash(tmp_path):
    base = {"prompt": _chat("q"), "reward_model": {"ground_truth": "1"}, "data_source": "d"}
    rows = [{**base, "prompt_id": "top", "extra_info": {"prompt_id": "inner", "index": 0}},
            {**base, "prompt": _chat("q2"), "extra_info": {"prompt_id": "inner2", "index": 1}},
            {**base, "prompt": _chat("q3"), "extra_info": {"index": 2}},
            {**base, "prompt": _chat("q4"), "extra_info": {}}]
    path = str(tmp_path / "ids.jsonl")
    _write_jsonl_lines(path, rows)
    got = [r.prompt_id for r in load_prompts(path)]
    assert got == ["top", "inner2", "2", _expected_id(_chat("q4"), "1")]


# ---------------------------------------------------------------- ids and fingerprints


def test_missing_ids_are_sha256_of_prompt_and_answer(tmp_path):
    rows = [{"prompt": "What is 2+2?", "answer": "4"}, {"prompt": _chat("What is 3+3?"), "answer": 6}]
    path = str(tmp_path / "noid.jsonl")
    _write_jsonl_lines(path, rows)
    got = load_prompts(path)
    assert [r.prompt_id for r in got] == [_expected_id("What is 2+2?", "4"), _expected_id(_chat("What is 3+3?"), "6")]
    assert got[1].answer == "6"  # numeric answers are kept as text
    assert stable_prompt_id("What is 2+2?", "4") == got[0].prompt_id


def test_ids_are_stable_across_processes(tmp_path):
    path = str(tmp_path / "noid.jsonl")
    _write_jsonl_lines(path, [{"prompt": f"problem {i} ünïcode", "answer": str(i)} for i in range(20)])
    code = "import sys; from cropi.data import load_prompts; print([r.prompt_id for r in load_prompts(sys.argv[1])])"
    outs = set()
    for hashseed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed, "PYTHONPATH": ROOT}
        outs.add(subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True, text=True,
                                check=True).stdout)
    assert len(outs) == 1
    assert outs.pop().strip() == str([r.prompt_id for r in load_prompts(path)])


def test_fingerprint_is_order_insensitive_format_independent_and_content_sensitive(tmp_path):
    records = _records()
    fp = prompts_fingerprint(records)
    assert prompts_fingerprint(records[::-1]) == fp
    write_verl_parquet(records, str(tmp_path / "v.parquet"))
    write_jsonl(records, str(tmp_path / "p.jsonl"))
    assert prompts_fingerprint(load_prompts(str(tmp_path / "v.parquet"))) == fp
    assert prompts_fingerprint(load_prompts(str(tmp_path / "p.jsonl"))) == fp
    assert prompts_fingerprint([records[0].model_copy(update={"extra_info": {"z": 1}}), *records[1:]]) == fp
    for change in ({"answer": "3"}, {"data_source": "other"}, {"prompt": _chat("What is 1+2?")}):
        assert prompts_fingerprint([records[0].model_copy(update=change), *records[1:]]) != fp
    assert prompts_fingerprint(records[:2]) != fp


# ---------------------------------------------------------------- refusals


def _bad_rows(path) -> BadRowsError:
    with pytest.raises(BadRowsError) as e:
        load_prompts(path)
    assert isinstance(e.value, InvalidInputError)
    return e.value


@pytest.mark.parametrize("row,reason", [
    ({"prompt_id": "r", "prompt": "q"}, "answer is missing"),
    ({"prompt_id": "r", "prompt": "q", "answer": "  "}, "answer is empty"),
    ({"prompt_id": "r", "prompt": "   ", "answer": "1"}, "prompt is empty"),
    ({"prompt_id": "r", "answer": "1"}, "prompt is missing"),
    ({"prompt_id": "r", "prompt": [], "answer": "1"}, "no chat messages"),
    ({"prompt_id": "r", "prompt": [{"content": "q"}], "answer": "1"}, "chat message 0 has no 'role'"),
    ({"prompt_id": "r", "prompt": [{"role": "user"}], "answer": "1"}, "chat message 0 has no 'content'"),
    ({"prompt_id": "r", "prompt": [{"role": "robot", "content": "q"}], "answer": "1"}, "role 'robot'"),
    ({"prompt_id": "r", "prompt": [{"role": "user", "content": 5}], "answer": "1"}, "'content' must be a string"),
    ({"prompt_id": "r", "prompt": ["q"], "answer": "1"}, "chat message 0 must be an object"),
    ({"prompt_id": "r", "prompt": [{"role": "user", "content": " "}], "answer": "1"}, "prompt is empty"),
    ({"prompt_id": "r", "prompt": "q", "answer": ["1"]}, "answer must be a string"),
    ({"prompt_id": "", "prompt": "q", "answer": "1"}, "prompt_id is empty"),
    ({"prompt_id": "r", "prompt": "q", "answer": "1", "extra_info": [1]}, "extra_info must be an object"),
    ({"prompt_id": "r", "prompt": "q", "answer": "1", "data_source": 3}, "data_source must be a string"),
])
def test_each_bad_row_is_named_with_its_line_and_reason(tmp_path, row, reason):
    path = str(tmp_path / "p.jsonl")
    _write_jsonl_lines(path, [{"prompt_id": "ok", "prompt": "fine", "answer": "1"}, row])
    err = _bad_rows(path)
    assert len(err.problems) == 1 and err.problems[0].where == "line 2"
    assert reason in err.problems[0].reason
    assert "line 2" in str(err) and reason in str(err)
    if row.get("prompt_id"):
        assert err.problems[0].prompt_id == row["prompt_id"] and "'r'" in str(err)


def test_bad_json_line_and_non_object_line_give_their_line_numbers(tmp_path):
    path = str(tmp_path / "p.jsonl")
    _write_jsonl_lines(path, [{"prompt": "a", "answer": "1"}, "", '{"prompt": "b", "answer": ', "[1, 2]",
                              {"prompt": "c", "answer": "3"}])
    err = _bad_rows(path)
    assert [(p.where, p.prompt_id) for p in err.problems] == [("line 3", None), ("line 4", None)]
    assert "not valid JSON" in err.problems[0].reason and "expected a JSON object" in err.problems[1].reason


@pytest.mark.parametrize("depth", [100_000, 40])
def test_a_line_nested_absurdly_deep_is_refused_not_a_recursion_error(tmp_path, depth):
    path = tmp_path / "p.jsonl"
    deep = '{"prompt": "q", "answer": "1", "extra_info": {"x": ' + "[" * depth + "]" * depth + "}}"
    path.write_text(json.dumps({"prompt": "a", "answer": "1"}) + "\n" + deep + "\n" + "[" * depth + "]" * depth + "\n")
    err = _bad_rows(str(path))
    assert [p.where for p in err.problems] == ["line 2", "line 3"]
    assert all("nested more than" in p.reason for p in err.problems)


def test_nesting_within_the_bound_still_loads(tmp_path):
    path = tmp_path / "p.jsonl"
    extra = {"a": {"b": {"c": [[1, 2], [3]]}}}
    path.write_text(json.dumps({"prompt_id": "r", "prompt": "q", "answer": "1", "extra_info": extra}) + "\n")
    assert load_prompts(str(path))[0].extra_info == extra


def test_duplicate_ids_name_both_rows(tmp_path):
    path = str(tmp_path / "p.jsonl")
    _write_jsonl_lines(path, [{"prompt_id": "x", "prompt": "a", "answer": "1"},
                              {"prompt_id": "y", "prompt": "b", "answer": "1"},
                              {"prompt_id": "x", "prompt": "c", "answer": "1"}])
    err = _bad_rows(path)
    assert [(p.where, p.prompt_id) for p in err.problems] == [("line 3", "x")]
    assert "duplicate prompt_id (first at line 1)" in str(err)


def test_the_same_prompt_twice_without_ids_is_a_duplicate(tmp_path):
    path = str(tmp_path / "p.parquet")
    pq.write_table(pa.Table.from_pylist([{"prompt": "same", "answer": "1"}] * 2 + [{"prompt": "other", "answer": "1"}]),
                   path)
    err = _bad_rows(path)
    assert [p.where for p in err.problems] == ["row 1"]
    assert "rows counted from 0" in str(err)


def test_verl_rows_missing_ground_truth_are_named(tmp_path):
    truths = [{"style": "rule", "ground_truth": "1"}, {"style": "rule", "ground_truth": None}, None]
    rows = [{"prompt": _chat(f"q{i}"), "reward_model": rm, "extra_info": {"index": i}} for i, rm in enumerate(truths)]
    path = str(tmp_path / "v.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    err = _bad_rows(path)
    assert [(p.where, p.prompt_id) for p in err.problems] == [("row 1", "1"), ("row 2", "2")]
    assert "reward_model.ground_truth is missing" in err.problems[0].reason
    assert "reward_model is missing" in err.problems[1].reason


def test_many_bad_rows_show_ten_and_count_the_rest(tmp_path):
    path = str(tmp_path / "p.jsonl")
    _write_jsonl_lines(path, [{"prompt_id": f"id{i}", "prompt": "q", "answer": ""} for i in range(23)])
    err = _bad_rows(path)
    assert len(err.problems) == 23
    msg = str(err)
    assert "23 invalid row(s)" in msg and "and 13 more" in msg
    assert all(f"line {n} (id 'id{n - 1}')" in msg for n in range(1, 11))
    assert "line 11" not in msg


@pytest.mark.parametrize("name,content,needle", [
    ("p.csv", b"prompt,answer\nq,1\n", "unknown prompt file type"),
    ("p.parquet", b"this is not parquet", "not a readable Parquet file"),
    ("p.jsonl", b'{"prompt": "q\xff", "answer": "1"}\n', "line 1 is not UTF-8"),
    ("p.jsonl", b"\n\n", "holds no prompts"),
    ("p.jsonl", b'{"prompt": "q", "answer": "1", "reward_model": {"ground_truth": "1"}}\n', "ambiguous"),
])
def test_unreadable_files_are_refused(tmp_path, name, content, needle):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(PromptFileError, match=needle):
        load_prompts(str(path))


def test_missing_file_and_directory_are_refused(tmp_path):
    with pytest.raises(PromptFileError, match="does not exist"):
        load_prompts(str(tmp_path / "nope.jsonl"))
    (tmp_path / "dir.parquet").mkdir()
    with pytest.raises(PromptFileError, match="not a file"):
        load_prompts(str(tmp_path / "dir.parquet"))


# ---------------------------------------------------------------- writer refusals and atomicity


def test_writers_refuse_bad_record_sets_and_leave_the_old_file(tmp_path):
    path = str(tmp_path / "p.parquet")
    write_parquet(_records(), path)
    before = open(path, "rb").read()
    dup = [_records()[0], _records()[0]]
    mixed = [PromptRecord(prompt_id="t", prompt="text", answer="1"), _records()[0]]
    clash = [PromptRecord(prompt_id="a", prompt="q", answer="1", extra_info={"k": 1}),
             PromptRecord(prompt_id="b", prompt="q", answer="1", extra_info={"k": "one"})]
    for records, needle in ((dup, "repeats prompt_id 'a'"), ([], "no records"), (mixed, "mix text prompts"),
                            (clash, "extra_info")):
        with pytest.raises(InvalidInputError, match=needle):
            write_parquet(records, path)
    assert open(path, "rb").read() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.parquet"]
    with pytest.raises(InvalidInputError, match="repeats"):
        write_verl_parquet(dup, str(tmp_path / "v.parquet"))
    with pytest.raises(InvalidInputError, match="repeats"):
        write_jsonl(dup, str(tmp_path / "v.jsonl"))


def test_writers_create_parent_directories_and_overwrite(tmp_path):
    path = str(tmp_path / "deep" / "er" / "stage.parquet")
    write_verl_parquet(_records(), path)
    write_verl_parquet(_records()[:1], path)
    assert load_prompts(path) == _records()[:1]


def test_reading_once_parses_each_file_once_and_an_edited_file_again(tmp_path, monkeypatch):
    from cropi.data import readers, reading_once

    path = str(tmp_path / "p.jsonl")
    write_jsonl([PromptRecord(prompt_id="a", prompt="q", answer="1")], path)
    parses = []
    real = readers._parse
    monkeypatch.setattr(readers, "_parse", lambda *a: parses.append(a[2]) or real(*a))
    load_prompts(path), load_prompts(path)
    assert len(parses) == 2  # outside a block every call reads the file
    with reading_once():
        first = load_prompts(path)
        first.append("not shared")  # each caller gets its own list
        assert [r.prompt_id for r in load_prompts(path)] == ["a"] and len(parses) == 3
        write_jsonl([PromptRecord(prompt_id="b", prompt="q2", answer="22")], path)
        os.utime(path, ns=(10**18, 10**18))  # a new modification time even on a coarse clock
        assert [r.prompt_id for r in load_prompts(path)] == ["b"] and len(parses) == 4
    load_prompts(path)
    assert len(parses) == 5  # the block's records are gone with it
