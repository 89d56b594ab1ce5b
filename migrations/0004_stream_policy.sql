-- runlog schema, version 4: what a session exposes to Sim agent-events-v1 clients.

-- Thinking and tool frames (never their arguments or results) reach a Sim
-- client only when its session allows them, and only a client that
-- negotiated the protocol (docs/compat.md). Set at creation; owners change
-- them with PATCH /v1/sessions/{id} (audited).
ALTER TABLE sessions ADD COLUMN include_thinking boolean NOT NULL DEFAULT false;
ALTER TABLE sessions ADD COLUMN include_tool_calls boolean NOT NULL DEFAULT false;
