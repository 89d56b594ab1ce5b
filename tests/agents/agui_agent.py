"""The AG-UI upstream adapter as a `runlog worker` subprocess runs it in the
tests (`RUNLOG_AGENT=tests.agents.agui_agent:agent`): the upstream is
`RUNLOG_AGUI_URL`, read when a run starts (tests/aguiserver.py serves it)."""

from workers.frameworks.agui import agent

__all__ = ["agent"]
