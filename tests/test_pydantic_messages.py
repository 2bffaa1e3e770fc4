"""Messages that are pydantic models (the OpenAI SDK's response objects) are stored as the dict
the OpenAI client itself sends for them; anything else that is not a mapping is refused."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pydantic
import pytest
from openai.types.chat import ChatCompletionMessage

from eventlog import EventLog, InvalidMessageError

COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "gpt-test",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "logprobs": None,
            "message": {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "annotations": [],
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
}


@pytest.fixture
def client_and_requests() -> Any:
    """The real OpenAI client, its requests answered offline by an httpx transport."""
    sent: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json=COMPLETION)

    client = openai.OpenAI(
        api_key="test",
        base_url="http://model.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(answer)),
        max_retries=0,
    )
    yield client, sent
    client.close()


def test_a_chat_completion_message_is_stored_as_the_client_sends_it(log, client_and_requests):
    client, sent = client_and_requests
    messages: list[Any] = [{"role": "user", "content": "weather in Oslo?"}]
    response = client.chat.completions.create(model="gpt-test", messages=messages)
    reply = response.choices[0].message
    assert isinstance(reply, ChatCompletionMessage)
    messages.append(reply)  # what agent loops do
    assert log.flush("s", messages).appended == 2
    messages.append({"role": "tool", "tool_call_id": "call_1", "content": "sunny"})
    client.chat.completions.create(model="gpt-test", messages=messages)  # the client sends the reply back
    stored = log.messages("s")
    assert stored[1] == sent[1]["messages"][1]  # exactly what went over the wire for it
    assert stored[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert isinstance(stored[1], dict) and "audio" not in stored[1]  # unset fields are not invented

    assert log.flush("s", messages).appended == 1  # the reply is not written twice
    again = log.flush("s", messages)
    assert (again.appended, again.tombstoned) == (0, 0)
    # a resumed loop sends the stored dicts; the model receives the same conversation
    client.chat.completions.create(model="gpt-test", messages=log.messages("s"))
    assert sent[2]["messages"] == sent[1]["messages"]


def test_a_pydantic_message_changed_in_place_is_recorded(log, client_and_requests):
    client, _ = client_and_requests
    messages: list[Any] = [{"role": "user", "content": "q"}]
    messages.append(client.chat.completions.create(model="gpt-test", messages=messages).choices[0].message)
    log.flush("s", messages)
    messages[1].content = "edited in place"
    result = log.flush("s", messages)
    assert (result.appended, result.tombstoned) == (1, 1)
    assert log.messages("s")[1]["content"] == "edited in place"
    assert log.history("s")[1].tombstone.reason == "edit"


@pytest.mark.parametrize("trust_identity", [False, True])
def test_pydantic_messages_in_every_write(tmp_path, trust_identity):
    reply = ChatCompletionMessage.model_validate(COMPLETION["choices"][0]["message"])
    wire = reply.model_dump(mode="json", exclude_unset=True)
    with EventLog.open(tmp_path / "log", trust_identity=trust_identity) as log:
        log.flush("f", [{"role": "user", "content": "q"}, reply])
        log.append("a", [{"role": "user", "content": "q"}, reply])
        log.flush_many({"m": [{"role": "user", "content": "q"}, reply]})
        log.compact("f", start=1, end=2, summary=[reply])
        for session in ("f", "a", "m"):
            assert log.messages(session)[1] == wire
        assert log.flush("m", [{"role": "user", "content": "q"}, reply]).appended == 0


def test_any_pydantic_model_is_dumped_as_json(log):
    class Note(pydantic.BaseModel):
        role: str
        content: str
        extra: int = 3

    log.flush("s", [Note(role="user", content="hi")])
    assert log.messages("s") == [{"role": "user", "content": "hi"}]  # unset defaults left out, as openai does


@pytest.mark.parametrize(
    ("value", "kind"),
    [(None, "NoneType"), (42, "int"), ("text", "str"), ([("role", "user")], "list"), (object(), "object")],
)
def test_a_message_that_is_not_a_mapping_names_index_and_type(log, value, kind):
    good = {"role": "user", "content": "ok"}
    for write in (
        lambda: log.flush("s", [good, value]),
        lambda: log.append("s", [good, value]),
        lambda: log.flush_many({"s": [good, value]}),
        lambda: log.compact("s", start=0, end=0, summary=[good, value]),
    ):
        with pytest.raises(InvalidMessageError, match=rf"messages\[1\]: {kind} is not a message") as caught:
            write()
        assert caught.value.index == 1
    assert log.sessions() == [] or log.messages("s") == []
