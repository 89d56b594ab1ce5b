-- runlog schema, version 11: the tables of the LangGraph adapter's checkpointer.
--
-- workers/frameworks/langgraph.py checkpoints graphs with langgraph-checkpoint-
-- postgres's AsyncPostgresSaver in this database. Its tables are created here,
-- with the rest of the schema (`runlog migrate`), not by the saver's setup() at
-- a worker's first graph: a worker needs no DDL rights, and the schema is the
-- same whether the langgraph extra is installed or not (docs/agents.md,
-- "LangGraph").
--
-- These are the statements of langgraph-checkpoint-postgres 3.2.0's
-- `MIGRATIONS` (langgraph/checkpoint/postgres/base.py), in its order, each
-- idempotent: a database whose saver already ran setup() keeps its tables. Its
-- indexes are created without CONCURRENTLY (a migration is one transaction;
-- the tables are new, or already have them). Its own bookkeeping,
-- `checkpoint_migrations`, records versions 0-9 as applied, so a setup() called
-- anyway finds nothing to do. tests/test_langgraph_checkpoints.py fails when
-- the installed library's setup() creates anything else: a new version of it
-- needs a new migration here.

CREATE TABLE IF NOT EXISTS checkpoint_migrations (
    v INTEGER PRIMARY KEY
);

CREATE TABLE IF NOT EXISTS checkpoints (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    parent_checkpoint_id TEXT,
    type TEXT,
    checkpoint JSONB NOT NULL,
    metadata JSONB NOT NULL DEFAULT '{}',
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
);

CREATE TABLE IF NOT EXISTS checkpoint_blobs (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    channel TEXT NOT NULL,
    version TEXT NOT NULL,
    type TEXT NOT NULL,
    blob BYTEA,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
);

CREATE TABLE IF NOT EXISTS checkpoint_writes (
    thread_id TEXT NOT NULL,
    checkpoint_ns TEXT NOT NULL DEFAULT '',
    checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    channel TEXT NOT NULL,
    type TEXT,
    blob BYTEA NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);

ALTER TABLE checkpoint_blobs ALTER COLUMN blob DROP NOT NULL;

CREATE INDEX IF NOT EXISTS checkpoints_thread_id_idx ON checkpoints (thread_id);
CREATE INDEX IF NOT EXISTS checkpoint_blobs_thread_id_idx ON checkpoint_blobs (thread_id);
CREATE INDEX IF NOT EXISTS checkpoint_writes_thread_id_idx ON checkpoint_writes (thread_id);

ALTER TABLE checkpoint_writes ADD COLUMN IF NOT EXISTS task_path TEXT NOT NULL DEFAULT '';

INSERT INTO checkpoint_migrations (v) SELECT generate_series(0, 9) ON CONFLICT (v) DO NOTHING;
