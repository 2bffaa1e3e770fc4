"""Run the real hermes agent loop offline, with the plugin `eventlog hermes install` put in its home.

Used by tests/test_integration_hermes.py in a subprocess (hermes keeps process-wide state: its
plugin manager, config caches, logging).  ``HERMES_HOME`` must point at a temporary home.
A local HTTP server stands in for an OpenAI-compatible endpoint: the scripted replies make
hermes call a tool, get an empty answer after it (so hermes inserts its recovery scaffolding),
and answer; then a second turn.  Writes hermes' own message lists, ``_`` keys included, as JSON
to the path given as the first argument.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def reply(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The scripted model: a tool call, then an empty answer once, then text."""
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    text = json.dumps(last)
    if last.get("role") == "user" and "weather" in text:
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "todo", "arguments": json.dumps({"todos": []})},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    if last.get("role") == "tool":
        return {"role": "assistant", "content": ""}, "stop"  # hermes recovers from this with scaffolding
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    return {"role": "assistant", "content": f"answer {turn}"}, "stop"


class Model(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        message, finish = reply(body)
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if body.get("stream"):
            delta = dict(message)
            if delta.get("tool_calls"):
                delta["tool_calls"] = [dict(call, index=i) for i, call in enumerate(delta["tool_calls"])]
            chunk = {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": body.get("model", "m"),
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                "usage": usage,
            }
            data = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
            kind = "text/event-stream"
        else:
            answer = {
                "id": "c",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "m"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": usage,
            }
            data, kind = json.dumps(answer).encode(), "application/json"
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main() -> None:
    out = Path(sys.argv[1])
    home = Path(os.environ["HERMES_HOME"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), Model)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    from hermes_state import SessionDB  # hermes' own store: it stamps _db_persisted on what it wrote
    from run_agent import AIAgent

    agent = AIAgent(
        base_url=f"http://127.0.0.1:{server.server_port}/v1",
        api_key="test",
        provider="custom",
        model="gpt-4o-mini",
        quiet_mode=True,
        skip_context_files=True,
        skip_memory=True,
        max_iterations=6,
        enabled_toolsets=["todo"],
        session_id="hermes-session",
        tool_delay=0,
        session_db=SessionDB(db_path=home / "state.db"),
    )
    first = agent.run_conversation("what is the weather?")
    second = agent.run_conversation("thanks!", conversation_history=first["messages"])
    server.shutdown()

    # Through hermes' own plugin system, as its turn finalizer calls it: the list of a turn
    # whose recovery scaffolding is still in it (hermes' own flags) ...
    from hermes_cli.plugins import invoke_hook

    history = second["messages"]
    scaffolded = history + [
        {"role": "assistant", "content": "(empty)", "_empty_recovery_synthetic": True},
        {"role": "user", "content": "Please process the tool results above.", "_empty_recovery_synthetic": True},
        {"role": "assistant", "content": "", "_thinking_prefill": True},
    ]
    invoke_hook("post_llm_call", session_id="hermes-session", conversation_history=scaffolded, model="gpt-4o-mini")
    # ... and a turn hermes interrupted (no hook fires), then the next turn's list.
    interrupted = history + [
        {"role": "user", "content": "book a flight"},
        {"role": "assistant", "content": "Searching"},
    ]
    resumed = interrupted + [{"role": "user", "content": "never mind"}, {"role": "assistant", "content": "ok"}]
    invoke_hook("post_llm_call", session_id="hermes-session", conversation_history=resumed, model="gpt-4o-mini")
    lists = {"first": first["messages"], "second": history, "scaffolded": scaffolded, "resumed": resumed}
    out.write_text(json.dumps(lists, default=repr), encoding="utf-8")


if __name__ == "__main__":
    main()
