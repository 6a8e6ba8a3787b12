"""Prompt files: one reader per format, each a table of good rows (what they become) and bad rows (the one-line error)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specconvert.errors import InputError
from specconvert.prompts import load_samples

U, A, S = "user", "assistant", "system"


def _chat(*turns):
    return {"messages": [{"role": r, "content": c} for r, c in turns]}


GOOD = [
    # (id, row, sample)
    ("messages-one-turn", {"messages": [{"role": U, "content": "hi"}]}, _chat((U, "hi"))),
    ("messages-multi-turn-keeps-every-turn",
     {"messages": [{"role": S, "content": "be brief"}, {"role": U, "content": "a"}, {"role": A, "content": "b"},
                   {"role": U, "content": "c"}, {"role": A, "content": "d"}]},
     _chat((S, "be brief"), (U, "a"), (A, "b"), (U, "c"), (A, "d"))),
    ("messages-text-parts-joined",
     {"messages": [{"role": U, "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]},
     _chat((U, "one\ntwo"))),
    ("messages-id-kept-other-keys-dropped",
     {"id": "x-1", "source": "web", "messages": [{"role": U, "content": "hi", "name": "bob"}]},
     {"id": "x-1", **_chat((U, "hi"))}),
    ("sharegpt",
     {"conversations": [{"from": "system", "value": "sys"}, {"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"},
                        {"from": "human", "value": "q2"}, {"from": "gpt", "value": "a2"}]},
     _chat((S, "sys"), (U, "q1"), (A, "a1"), (U, "q2"), (A, "a2"))),
    ("sharegpt-leading-gpt-turn-dropped",
     {"conversations": [{"from": "gpt", "value": "hello!"}, {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]},
     _chat((U, "q"), (A, "a"))),
    ("sharegpt-speaker-case-and-aliases",
     {"conversations": [{"from": "Human", "value": "q"}, {"from": "chatgpt", "value": "a"}]}, _chat((U, "q"), (A, "a"))),
    ("sharegpt-with-role-content-fields",
     {"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, _chat((U, "q"), (A, "a"))),
    ("category-kept-for-bench", {"id": "c1", "category": " code ", "prompt": "def f():"},
     {"id": "c1", "category": "code", "prompt": "def f():"}),
    ("prompt", {"prompt": "Once upon a time"}, {"prompt": "Once upon a time"}),
    ("text", {"text": "plain prose"}, {"text": "plain prose"}),
]


@pytest.mark.parametrize("row,sample", [pytest.param(r, s, id=i) for i, r, s in GOOD])
def test_good_rows_become_samples(tmp_path, row, sample):
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert load_samples(str(path), "draft.train.prompts", tmp_path) == [sample]


BAD = [
    # (id, line, the error after "draft.train.prompts: <file>:2")
    ("not-json", "{nope", "is not valid JSON"),
    ("not-an-object", "[1, 2]", "is a JSON array, not an object"),
    ("no-format-key", '{"question": "hi"}', "has no 'messages', 'conversations', 'prompt' or 'text' field"),
    ("two-format-keys", '{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}', "has both 'messages' and 'prompt'"),
    ("messages-not-a-list", '{"messages": "hi"}', "'messages' is a JSON string, not a list of messages"),
    ("messages-empty", '{"messages": []}', "'messages' has no user turn"),
    ("messages-item-not-object", '{"messages": ["hi"]}', "messages[0] is a JSON string, not an object"),
    ("messages-no-role", '{"messages": [{"content": "hi"}]}', "messages[0] needs a string 'role'"),
    ("messages-null-content", '{"messages": [{"role": "user", "content": null}]}', "messages[0] content is a JSON null"),
    ("messages-image-part", '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}',
     "messages[0].content[0] is not a text part (type 'image_url')"),
    ("messages-no-user-turn", '{"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]}',
     "'messages' has no user turn"),
    ("messages-empty-user-turn", '{"messages": [{"role": "user", "content": "  "}]}', "'messages' has an empty user turn"),
    ("messages-unknown-role",
     '{"messages": [{"role": "user", "content": "q"}, {"role": "wizard", "content": "a"}]}',
     "messages[1] has role 'wizard', not system, developer, user, assistant, tool, function or ipython"),
    ("sharegpt-not-a-list", '{"conversations": {"from": "human"}}', "'conversations' is a JSON object, not a list of turns"),
    ("sharegpt-unknown-speaker", '{"conversations": [{"from": "bot", "value": "hi"}]}',
     "conversations[0] has from 'bot', not human, gpt or system"),
    ("sharegpt-no-from", '{"conversations": [{"value": "hi"}]}', "conversations[0] has from None"),
    ("sharegpt-value-not-string", '{"conversations": [{"from": "human", "value": 3}]}', "conversations[0] content is a JSON number"),
    ("sharegpt-only-gpt", '{"conversations": [{"from": "gpt", "value": "hi"}]}', "'conversations' has no user turn"),
    ("prompt-not-string", '{"prompt": ["a"]}', "'prompt' is a JSON array, not a string"),
    ("prompt-empty", '{"prompt": " "}', "'prompt' is empty"),
    ("text-not-string", '{"text": 5}', "'text' is a JSON number, not a string"),
    ("category-not-string", '{"category": 3, "prompt": "a"}', "'category' that is a JSON number, not a non-empty string"),
]


@pytest.mark.parametrize("line,needle", [pytest.param(l, n, id=i) for i, l, n in BAD])
def test_bad_rows_name_file_line_and_fix(tmp_path, line, needle):
    path = tmp_path / "set.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(InputError) as exc:
        load_samples(str(path), "draft.train.prompts", tmp_path)
    text = exc.value.one_line()
    assert text.startswith(f"draft.train.prompts: {path}:2") and needle in text, text
    assert "\n" not in text and exc.value.fix and exc.value.exit_code == 2


def test_a_json_array_file_reads_like_jsonl_and_names_the_item(tmp_path):
    """The ShareGPT dumps ship as one JSON array; read as paragraphs of text it trained on JSON syntax."""
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([{"conversations": [{"from": "human", "value": "q"}]}, {"prompt": "p"}]))
    assert load_samples(str(path), "k", tmp_path) == [_chat((U, "q")), {"prompt": "p"}]
    path.write_text(json.dumps([{"prompt": "p"}, {"conversations": [{"from": "robot", "value": "q"}]}]))
    with pytest.raises(InputError, match=r"sharegpt.json item 1: conversations\[0\] has from 'robot'"):
        load_samples(str(path), "k", tmp_path)
    path.write_text('{"conversations": []}')
    with pytest.raises(InputError, match="holds a JSON object, not an array"):
        load_samples(str(path), "k", tmp_path)


@pytest.mark.parametrize("spec,needle", [
    ("self:0", "needs a whole number of prompts of at least 1"),
    ("self:many", "needs a whole number"),
    ("self:5", "is only read by draft.train.prompts"),
])
def test_self_specs_are_not_files(tmp_path, spec, needle):
    with pytest.raises(InputError, match=needle):
        load_samples(spec, "bench.prompts", tmp_path)


def test_every_builtin_set_reads():
    from specconvert.prompts import builtin_names

    for name in builtin_names():
        assert load_samples(f"builtin:{name}", "k", Path("."))


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_a_jsonl_row_holding_a_unicode_line_separator_stays_one_row(tmp_path, separator):
    """str.splitlines() also splits on U+2028/U+2029/U+0085 (ShareGPT exports hold them raw in strings)."""
    path = tmp_path / "set.jsonl"
    rows = [{"prompt": f"first{separator}half"}, {"prompt": "second"}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert load_samples(str(path), "k", tmp_path) == rows
