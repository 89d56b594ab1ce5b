-- runlog schema, version 3: per-user token revocation.

-- A token of user_id whose `iat` is before not_before is refused, and the
-- connections it opened are ended (`runlog revoke --user`). Gateways keep
-- this table in memory: it is read at start and at every access re-check,
-- never per request.
CREATE TABLE token_revocations (
    user_id      text PRIMARY KEY,
    not_before   timestamptz NOT NULL,
    revoked_by   text NOT NULL DEFAULT '',
    revoked_at   timestamptz NOT NULL DEFAULT now()
);
