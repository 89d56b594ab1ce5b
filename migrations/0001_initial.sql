-- runlog schema, version 1: sessions, members, runs, events, approvals, audit.
-- Ids are random text (>= 128 bits); "C" collation keeps their comparisons byte-wise and cheap.

CREATE TABLE sessions (
    session_id   text COLLATE "C" PRIMARY KEY,
    title        text NOT NULL DEFAULT '',
    created_by   text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- Session-level cursor: the last one given to an event of any run of this
    -- session. Taken under this row's lock, so cursors commit in order.
    last_cursor  bigint NOT NULL DEFAULT 0
);

CREATE TABLE members (
    session_id   text COLLATE "C" NOT NULL REFERENCES sessions ON DELETE CASCADE,
    user_id      text NOT NULL,
    role         text NOT NULL CHECK (role IN ('owner', 'approver', 'viewer')),
    added_by     text NOT NULL DEFAULT '',
    added_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, user_id)
);

CREATE TABLE runs (
    run_id       text COLLATE "C" PRIMARY KEY,
    session_id   text COLLATE "C" NOT NULL REFERENCES sessions ON DELETE CASCADE,
    status       text NOT NULL DEFAULT 'queued' CHECK (status IN
                   ('queued', 'running', 'waiting_approval', 'completed', 'aborted', 'failed')),
    started_by   text NOT NULL DEFAULT '',
    model        text NOT NULL DEFAULT '',
    input        text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now(),
    ended_at     timestamptz,
    -- Ownership and fencing: a writer appends only while owner_epoch is the
    -- epoch it was given when it took the run. Taking a run over bumps it.
    owner_id     text,
    owner_epoch  bigint NOT NULL DEFAULT 0,
    lease_until  timestamptz,
    -- Last seq committed for this run (0: none yet).
    last_seq     bigint NOT NULL DEFAULT 0
);
CREATE INDEX runs_session_idx ON runs (session_id, created_at);
CREATE INDEX runs_active_idx ON runs (status, lease_until) WHERE ended_at IS NULL;

-- The log. payload is the event's JSON, encoded once when appended and sent
-- to clients verbatim. No foreign key: a per-row check costs ingest; runs are
-- pruned with their events explicitly.
CREATE TABLE events (
    run_id       text COLLATE "C" NOT NULL,
    seq          bigint NOT NULL,
    session_id   text COLLATE "C" NOT NULL,
    cursor       bigint NOT NULL,
    ts           bigint NOT NULL,
    type         text NOT NULL,
    payload      bytea NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE UNIQUE INDEX events_session_cursor_idx ON events (session_id, cursor);

CREATE TABLE approvals (
    approval_id  text COLLATE "C" PRIMARY KEY,
    run_id       text COLLATE "C" NOT NULL REFERENCES runs ON DELETE CASCADE,
    tool_call_id text NOT NULL,
    summary      text NOT NULL DEFAULT '',
    requested_seq bigint NOT NULL DEFAULT 0,
    expires_at   timestamptz NOT NULL,
    decision     text CHECK (decision IN ('approve', 'reject', 'expired')),
    decided_by   text,
    decided_at   timestamptz,
    comment      text NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX approvals_run_idx ON approvals (run_id);

CREATE TABLE audit (
    audit_id     bigserial PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT now(),
    actor        text NOT NULL,
    action       text NOT NULL,
    session_id   text COLLATE "C",
    run_id       text COLLATE "C",
    detail       jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_run_idx ON audit (run_id, at);
