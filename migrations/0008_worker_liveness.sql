-- runlog schema, version 8: a dead worker's runs are taken over in seconds.

-- `owner_lock` is the key of the session-level advisory lock the owning
-- worker holds on a connection of its own (pg_advisory_lock(1919709031,
-- owner_lock); workers/liveness.py). PostgreSQL releases it the moment that
-- connection ends, so a run whose owner_lock nobody holds has a dead owner
-- and is taken over without waiting for its lease. NULL: claimed by a worker
-- of an earlier version (the lease alone decides).
ALTER TABLE runs ADD COLUMN owner_lock integer;

-- How many times the run was taken over from another worker (GET /v1/runs/{id}).
ALTER TABLE runs ADD COLUMN takeovers integer NOT NULL DEFAULT 0;
