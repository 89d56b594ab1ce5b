-- runlog schema, version 9: a run waiting for an approval holds no worker slot.

-- `parked_on`: the approval a parked run waits for. Parking ends the run's
-- execution once the approval is durably requested (the worker's slot is
-- free again) and clears its lease and liveness key, so no takeover touches
-- it. The decision, the approval's expiry or a stop wakes it: any worker
-- claims it (epoch + 1, parked_on NULL) and resumes it by its durable replay.
ALTER TABLE runs ADD COLUMN parked_on text COLLATE "C";
CREATE INDEX runs_parked_idx ON runs (parked_on) WHERE parked_on IS NOT NULL AND ended_at IS NULL;
