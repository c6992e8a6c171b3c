"""``kind: SFTJob``'s data path: chat transcripts from JSONL or Parquet, the chat template, the loss on
assistant turns only (``slime.data.chat``, ``slime.data.jsonl`` with ``sft=True``).

Real parts: the built-in tiny model's tokenizer and chat template, pyarrow writing a real Parquet file.
"""

from __future__ import annotations

import json

import pytest

from slime.data.chat import render_messages
from slime.data.jsonl import DatasetError, PromptDataset
from slime.spec.resolve import count_jsonl_rows

pytest.importorskip("transformers")

CHAT = [
    {"role": "system", "content": "Add."},
    {"role": "user", "content": "07+12="},
    {"role": "assistant", "content": "19"},
    {"role": "user", "content": "reverse"},
    {"role": "assistant", "content": "91"},
]


@pytest.fixture(scope="module")
def tok():
    from slime.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


def _trained_text(tok, sample) -> str:
    """The tokens under loss mask 1, decoded in order."""
    response = sample["tokens"][len(sample["tokens"]) - sample["response_length"] :]
    return tok.decode([t for t, m in zip(response, sample["loss_mask"]) if m], skip_special_tokens=False)


def test_the_loss_covers_each_assistant_turn_and_its_end_of_turn_token_only(tok):
    sample = render_messages(tok, CHAT)
    full = tok.apply_chat_template(CHAT, tokenize=False)
    assert tok.decode(sample["tokens"], skip_special_tokens=False) == full
    assert _trained_text(tok, sample) == "19<|im_end|>91<|im_end|>"
    assert len(sample["loss_mask"]) == sample["response_length"]
    # the prompt (system + first user turn + the assistant header) is outside the response
    prompt = tok.apply_chat_template(CHAT[:2], tokenize=False, add_generation_prompt=True)
    assert sample["response_length"] == len(sample["tokens"]) - len(tok.encode(prompt, add_special_tokens=False))


def test_a_transcript_without_an_assistant_turn_is_refused(tok):
    with pytest.raises(ValueError, match="no assistant message"):
        render_messages(tok, CHAT[:2])


def _write(tmp_path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl, parquet = tmp_path / "d.jsonl", tmp_path / "d.parquet"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    return jsonl, parquet


def test_jsonl_and_parquet_give_the_same_rows_prompt_before_the_last_reply_and_it_as_label(tok, tmp_path):
    rows = [{"messages": CHAT, "id": 1}, {"messages": CHAT[1:3], "id": 2}]
    jsonl, parquet = _write(tmp_path, rows)
    args = dict(input_key="messages", label_key=None, tokenizer=tok, apply_chat_template=True, sft=True, shuffle=False)
    a, b = PromptDataset(jsonl, **args), PromptDataset(parquet, **args)
    assert [(r.text, r.label, r.metadata) for r in a.rows] == [(r.text, r.label, r.metadata) for r in b.rows]
    assert a.rows[0].label == "91" and a.rows[1].label == "19"
    assert a.rows[0].text == tok.apply_chat_template(CHAT[:4], tokenize=False, add_generation_prompt=True)
    assert render_messages(tok, a.rows[0].prompt) == render_messages(tok, b.rows[0].prompt)
    assert count_jsonl_rows(str(parquet)) == count_jsonl_rows(str(jsonl)) == 2


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ({"messages": "07+12="}, ["'messages' must be chat messages", "assistant"]),
        ({"messages": [{"role": "assistant", "content": "19"}]}, ["a message before an assistant reply"]),
        ({"prompt": "x"}, ["missing key 'messages'", "input_key"]),
    ],
)
def test_a_row_sft_cannot_train_on_is_named_with_its_file_and_line(tok, tmp_path, row, words):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": CHAT}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DatasetError) as err:
        PromptDataset(path, input_key="messages", tokenizer=tok, apply_chat_template=True, sft=True)
    assert f"{path}:2" in str(err.value)
    for w in words:
        assert w in str(err.value)


def test_an_unreadable_parquet_file_is_a_dataset_error(tok, tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"not parquet")
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        PromptDataset(path, input_key="messages", tokenizer=tok, apply_chat_template=True, sft=True)
