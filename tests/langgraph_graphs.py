"""Real LangGraph graphs for the checkpointer tests: a MessagesState agent with a tool, run by a scripted model."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"result for {query}: " + "lorem ipsum " * 20


def scripted(turns: int, *, tools_every: int = 2) -> list[BaseMessage]:
    """The model's replies for ``turns`` user turns: every ``tools_every``-th turn calls the tool first."""
    out: list[BaseMessage] = []
    for turn in range(turns):
        if tools_every and turn % tools_every == 0:
            out.append(
                AIMessage(
                    content="",
                    id=f"ai-{turn}-call",
                    tool_calls=[{"name": "lookup", "args": {"query": f"q{turn}"}, "id": f"call-{turn}"}],
                )
            )
        out.append(AIMessage(content=f"answer {turn} " + "dolor sit amet " * 10, id=f"ai-{turn}"))
    return out


def agent_graph(responses: Sequence[BaseMessage], checkpointer: Any, **compile_options: Any) -> Any:
    """START -> agent -> (tools -> agent)* -> END, the agent answering from ``responses`` in order.

    The reply is chosen by how many model replies the conversation already holds, so a step
    that runs again (after a crash, or from an older checkpoint) gets the reply it had.
    """
    replies = list(responses)

    def agent(state: MessagesState) -> dict[str, Any]:
        done = sum(isinstance(m, AIMessage) for m in state["messages"])
        model = FakeMessagesListChatModel(responses=[replies[done]])
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer, **compile_options)


def without_ids(messages: Sequence[BaseMessage]) -> list[tuple[str, Any, Any]]:
    """What a conversation says, whatever ids LangGraph generated for its messages."""
    return [(m.type, m.content, getattr(m, "tool_calls", None)) for m in messages]


__all__ = ["END", "agent_graph", "lookup", "scripted", "without_ids"]
