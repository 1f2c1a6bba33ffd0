"""The fake OpenAI server (`fake_openai.py`) speaks the Chat Completions wire format the way the
real API does, so the tutorial tests that drive the runtime with it test something real."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from fake_openai import ChatRequest, FakeOpenAI, Text, ToolCalls, after_tool, all_of, user_says

KEY = "sk-fake-key"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Look up an order by id",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
    }
]


@pytest.fixture()
def fake():
    with FakeOpenAI(api_key=KEY) as server:
        yield server


def post(fake: FakeOpenAI, body: dict[str, Any], key: str = KEY) -> httpx.Response:
    return httpx.post(
        f"{fake.base_url}/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=10,
    )


def events(response: httpx.Response) -> list[Any]:
    """The `data:` payloads of an SSE body, JSON-decoded except the final `[DONE]`."""
    assert response.headers["content-type"].startswith("text/event-stream")
    out = []
    for block in response.text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def conversation(user: str, *rest: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": user}, *rest]


def test_streamed_tool_calls_arrive_in_pieces_with_finish_reason_and_usage(fake):
    fake.reply(ToolCalls.of(("lookup_order", {"order_id": "ORD-1"}), ("lookup_order", {"order_id": "ORD-2"})))
    response = post(
        fake,
        {
            "model": "gpt-4o",
            "messages": conversation("check ORD-1 and ORD-2"),
            "tools": TOOLS,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert response.status_code == 200
    data = events(response)
    assert data[-1] == "[DONE]"
    chunks = data[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    # The last chunk carries only the usage; the one before it the finish reason.
    assert chunks[-1]["choices"] == []
    usage = chunks[-1]["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"

    # Reassemble the calls the way a client must: by index, arguments concatenated.
    calls: dict[int, dict[str, str]] = {}
    pieces: dict[int, int] = {}
    for c in chunks[:-1]:
        for call in c["choices"][0]["delta"].get("tool_calls", []):
            slot = calls.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
            if "id" in call:
                assert slot["id"] == "", "the id comes once, in the call's first piece"
                slot["id"] = call["id"]
                assert call["type"] == "function"
                slot["name"] = call["function"]["name"]
            slot["arguments"] += call["function"].get("arguments", "")
            pieces[call["index"]] = pieces.get(call["index"], 0) + 1
    assert [calls[i]["name"] for i in (0, 1)] == ["lookup_order", "lookup_order"]
    assert [json.loads(calls[i]["arguments"]) for i in (0, 1)] == [{"order_id": "ORD-1"}, {"order_id": "ORD-2"}]
    assert calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[1]["id"]
    assert min(pieces.values()) >= 3, "arguments must be split across several chunks"
    assert fake.requests[0].answered_calls[0][0] == calls[0]["id"]


def test_streamed_text_without_usage_unless_asked(fake):
    fake.reply(Text("The order was delivered."))
    response = post(fake, {"model": "gpt-4o", "messages": conversation("hi"), "stream": True})
    chunks = events(response)[:-1]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "The order was delivered."
    assert len(chunks) > 3
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in c for c in chunks)


def test_non_streaming_completion(fake):
    fake.reply(ToolCalls.of(("lookup_order", {"order_id": "ORD-9"}), text="Let me check."))
    response = post(fake, {"model": "gpt-4o", "messages": conversation("check ORD-9"), "tools": TOOLS})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check."
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "lookup_order"
    assert json.loads(call["function"]["arguments"]) == {"order_id": "ORD-9"}
    assert body["usage"]["total_tokens"] > 0


def test_rules_are_chosen_by_the_request_and_requests_are_recorded(fake):
    fake.reply(Text("ORD-2 answer"), when=user_says("ORD-2"))
    fake.reply(
        lambda r: Text(f"saw {r.results_of('lookup_order')[0]}"),
        when=all_of(user_says("ORD-1"), after_tool("lookup_order")),
    )
    fake.reply(ToolCalls.of(("lookup_order", {"order_id": "ORD-1"})), when=user_says("ORD-1"))

    first = post(fake, {"model": "gpt-4o", "messages": conversation("check ORD-1"), "tools": TOOLS})
    call = first.json()["choices"][0]["message"]["tool_calls"][0]
    follow_up = conversation(
        "check ORD-1",
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"found": true}'},
    )
    second = post(fake, {"model": "gpt-4o", "messages": follow_up, "tools": TOOLS})
    assert second.json()["choices"][0]["message"]["content"] == 'saw {"found": true}'
    third = post(fake, {"model": "gpt-4o", "messages": conversation("and ORD-2?")})
    assert third.json()["choices"][0]["message"]["content"] == "ORD-2 answer"

    assert fake.unused_rules() == [] and fake.problems == []
    recorded: ChatRequest = fake.wait_for(after_tool("lookup_order"), "the lookup result")
    assert recorded.tool_results() == [("lookup_order", call["id"], '{"found": true}')]
    assert recorded.tool_calls() == [(call["id"], "lookup_order", {"order_id": "ORD-1"})]
    assert recorded.user_texts() == ["check ORD-1"] and recorded.system_text() == "be brief"
    assert [r.status for r in fake.requests] == [200, 200, 200]


def test_an_unscripted_request_is_a_server_error_and_a_problem(fake):
    response = post(fake, {"model": "gpt-4o", "messages": conversation("anything")})
    assert response.status_code == 500
    assert "no scripted reply" in response.json()["error"]["message"]
    assert len(fake.problems) == 1
    with pytest.raises(TimeoutError, match="never received the lookup"):
        fake.wait_for(after_tool("lookup_order"), "the lookup", timeout=0.2)


def test_a_chunked_request_body_is_read(fake):
    fake.reply(Text("chunked ok"))
    body = json.dumps({"model": "gpt-4o", "messages": conversation("hi")}).encode()
    response = httpx.post(
        f"{fake.base_url}/chat/completions",
        content=iter([body[:10], body[10:]]),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "chunked ok"
    assert fake.requests[0].user_texts() == ["hi"]


def test_a_wrong_key_is_rejected_like_the_real_api(fake):
    fake.reply(Text("never"))
    response = post(fake, {"model": "gpt-4o", "messages": conversation("hi")}, key="sk-other")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert fake.unused_rules() == ["Text(text='never')"]


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        (
            conversation("hi", {"role": "tool", "tool_call_id": "call_x", "content": "{}"}),
            "must be a response to a preceeding message with 'tool_calls'",
        ),
        (
            conversation(
                "hi",
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "call_y", "type": "function", "function": {"name": "lookup_order", "arguments": "{}"}}
                    ],
                },
                {"role": "user", "content": "well?"},
            ),
            "did not have response messages: call_y",
        ),
        ([], "too short"),
    ],
    ids=["orphan-tool-result", "unanswered-tool-call", "no-messages"],
)
def test_malformed_conversations_are_rejected_like_the_real_api(fake, messages, message):
    fake.reply(Text("never"))
    response = post(fake, {"model": "gpt-4o", "messages": messages, "tools": TOOLS})
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
