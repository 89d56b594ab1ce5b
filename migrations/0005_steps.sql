-- runlog schema, version 5: durable steps of agents (workers/api.py).

-- One row per durable operation of a run, by call order (idx): a step's
-- stored result, or an approval's id and then its decision. `seq` is where
-- the run's log ended when the row was written: a takeover replays the
-- agent, drops the events up to the last row's seq (already in the log) and
-- retracts the ones after it. Written only by the run's owner (fenced).
CREATE TABLE run_steps (
    run_id       text COLLATE "C" NOT NULL REFERENCES runs ON DELETE CASCADE,
    idx          integer NOT NULL,
    name         text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('step', 'approval')),
    done         boolean NOT NULL,
    result       bytea,
    seq          bigint NOT NULL,
    epoch        bigint NOT NULL,  -- the owner epoch that created the row
    last_epoch   bigint NOT NULL,  -- the owner epoch that wrote it last
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, idx)
);
