"""The shared workload: realistic agent transcripts from a fixed seed.

A *turn* is ten messages, the shape of a tool-using agent turn in the OpenAI
chat-completions format:

    user -> (assistant with one tool call -> tool result) x 4 -> assistant answer

Contents are 200-2,000 characters of words (so full-text search has real tokens
to index), tool-call arguments are JSON strings, and every message carries a
timestamp.  The same seed always gives the same bytes, so every system in a run
writes exactly the same data, and two runs on two machines write the same data.

    >>> from benchmarks.workload import Workload
    >>> turn = Workload(seed=7).turn(0)
    >>> [m["role"] for m in turn][:3], len(turn)
    (['user', 'assistant', 'tool'], 10)
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

MESSAGES_PER_TURN = 10
SEED = 20_240_601
START_TIME = 1_717_200_000.0  # a fixed epoch second: timestamps are part of the data

TOOLS = ("read_file", "search_files", "run_shell", "web_search", "write_file", "list_dir")
MIN_CHARS, MODE_CHARS, MAX_CHARS = 200, 450, 2000


def _vocabulary(rng: random.Random, size: int = 3000) -> list[str]:
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    weights = [12, 9, 8, 8, 7, 7, 6, 6, 6, 4, 4, 3, 3, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1]
    words = set()
    while len(words) < size:
        words.add("".join(rng.choices(letters, weights, k=rng.randint(2, 11))))
    ordered = sorted(words)
    rng.shuffle(ordered)  # word frequency (Zipf-like, by index) independent of spelling
    return ordered


class Workload:
    """A deterministic stream of agent messages.

    ``turn(n)`` returns turn ``n`` (ten fresh dicts, the same for the same seed
    and ``n``); ``messages(count)`` the first ``count`` messages of a session;
    ``session(count)`` yields ``(all_messages_so_far, new_messages)`` per turn, the
    list growing in place the way an agent's list does.  Different ``salt`` values
    give different sessions from the same seed.
    """

    def __init__(self, seed: int = SEED, salt: str = "") -> None:
        self.seed = seed
        self.salt = salt
        self._words = _vocabulary(random.Random(seed))

    def _text(self, rng: random.Random, size: int) -> str:
        words = self._words
        out: list[str] = []
        length = 0
        while length < size:
            word = words[int(len(words) * rng.random() ** 3)]  # frequent and rare words
            out.append(word)
            length += len(word) + 1
        text = " ".join(out)[:size]
        return text[0].upper() + text[1:]

    def _size(self, rng: random.Random) -> int:
        return int(rng.triangular(MIN_CHARS, MAX_CHARS, MODE_CHARS))

    def turn(self, n: int) -> list[dict[str, Any]]:
        rng = random.Random(f"{self.seed}/{self.salt}/{n}")
        clock = START_TIME + n * 60.0
        out: list[dict[str, Any]] = [
            {"role": "user", "content": self._text(rng, self._size(rng)), "timestamp": clock},
        ]
        for _ in range(4):
            clock += rng.uniform(0.5, 8.0)
            tool = rng.choice(TOOLS)
            call_id = f"call_{rng.getrandbits(64):016x}"
            size = self._size(rng)
            thought = self._text(rng, max(40, size // 3)) if rng.random() < 0.5 else None
            arguments = json.dumps(
                {
                    "path": f"src/{rng.choice(self._words)}/{rng.choice(self._words)}.py",
                    "query": self._text(rng, max(40, size - 60 - (len(thought) if thought else 0))),
                },
            )
            out.append(
                {
                    "role": "assistant",
                    "content": thought,
                    "tool_calls": [
                        {"id": call_id, "type": "function", "function": {"name": tool, "arguments": arguments}}
                    ],
                    "finish_reason": "tool_calls",
                    "timestamp": clock,
                }
            )
            clock += rng.uniform(0.05, 3.0)
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "tool_name": tool,
                    "content": self._text(rng, self._size(rng)),
                    "timestamp": clock,
                }
            )
        clock += rng.uniform(0.5, 8.0)
        out.append(
            {
                "role": "assistant",
                "content": self._text(rng, self._size(rng)),
                "finish_reason": "stop",
                "timestamp": clock,
            }
        )
        assert len(out) == MESSAGES_PER_TURN
        return out

    def messages(self, count: int) -> list[dict[str, Any]]:
        """The first ``count`` messages of the session."""
        out: list[dict[str, Any]] = []
        n = 0
        while len(out) < count:
            out.extend(self.turn(n))
            n += 1
        del out[count:]
        return out

    def session(self, count: int) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
        """Per turn until ``count`` messages: ``(the growing list, this turn's messages)``."""
        messages: list[dict[str, Any]] = []
        n = 0
        while len(messages) < count:
            new = self.turn(n)[: count - len(messages)]
            messages.extend(new)
            n += 1
            yield messages, new


def message_chars(message: dict[str, Any]) -> int:
    """Characters of text in a message (content plus tool-call arguments)."""
    size = len(message.get("content") or "")
    for call in message.get("tool_calls") or ():
        size += len(call["function"]["arguments"])
    return size
