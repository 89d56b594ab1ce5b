-- runlog schema, version 2: what workers need to stop, pause and resume runs.

-- Interrupts are recorded on the run before they are sent, so a worker that
-- takes the run later (or restarts) still sees the stop.
ALTER TABLE runs ADD COLUMN interrupt_requested_by text;
ALTER TABLE runs ADD COLUMN interrupt_requested_at timestamptz;
ALTER TABLE runs ADD COLUMN interrupt_reason text NOT NULL DEFAULT '';
-- The agent's state while it waits (e.g. for an approval), written by the
-- owner under its epoch, so any worker can resume the run.
ALTER TABLE runs ADD COLUMN checkpoint bytea;

-- What a new run does when the session already has one running:
-- 'reject', 'enqueue' (start it after the running ones end) or 'interrupt'
-- (stop the running ones, then start).
ALTER TABLE sessions ADD COLUMN run_policy text NOT NULL DEFAULT 'enqueue'
    CHECK (run_policy IN ('reject', 'enqueue', 'interrupt'));

CREATE INDEX approvals_open_idx ON approvals (expires_at) WHERE decision IS NULL;
