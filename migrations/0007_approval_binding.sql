-- runlog schema, version 7: an approval is bound to the tool call it guards.

-- `call_digest` is the SHA-256 (hex) of what the approver was shown: the
-- tool call's name and its complete argument text as the log stores them
-- (or, for an approval guarding no tool call, its summary); see
-- workers/binding.py. A replay after a takeover applies a stored decision
-- only to a call with the same digest, and a decision request that carries
-- the digest the approver saw is refused (409 approval_stale) when it no
-- longer matches. Empty for approvals created before this version.
ALTER TABLE approvals ADD COLUMN call_digest text NOT NULL DEFAULT '';
