-- runlog schema, version 10: queued runs are taken fairly between users.

-- `started_at`: when a worker first took the run (NULL: still queued, or
-- started before this version). A worker taking a job prefers a queued run of
-- the user with the fewest runs executing, then the one served least recently
-- (the latest started_at of their runs): Store.fairer_queued_run.
ALTER TABLE runs ADD COLUMN started_at timestamptz;
CREATE INDEX runs_user_active_idx ON runs (started_by) WHERE ended_at IS NULL;
CREATE INDEX runs_user_started_idx ON runs (started_by, started_at);
