"""Integrations that make the event log the session store of agent frameworks.

Each lives in its own module and needs its framework installed through an extra,
for example ``pip install 'agent-eventlog[langgraph]'``; importing ``eventlog`` never
imports a framework.
"""

from __future__ import annotations
