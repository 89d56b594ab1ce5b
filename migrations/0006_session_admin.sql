-- runlog schema, version 6: archived sessions, and the session list by member.

-- An archived session leaves its members' default list (GET /v1/sessions;
-- `?archived=true` lists them) and takes no new run (409 session_archived);
-- its history stays readable. Owners archive and unarchive it with
-- PATCH /v1/sessions/{id} (audited).
ALTER TABLE sessions ADD COLUMN archived_at timestamptz;

-- The list is "the sessions user_id is a member of": without this index it
-- scans every membership (the primary key starts with session_id). A title
-- search (`?q=`) filters that member's sessions only, so it needs no index
-- of its own.
CREATE INDEX members_user_idx ON members (user_id, session_id);

-- The title as a search compares it: Python's str.casefold(), written with the
-- title (broker/sessions.py), so the search ignores case in every script
-- whatever the database's locale (lower() folds ASCII only under "C", which
-- the embedded PostgreSQL uses). Titles written before this version get
-- lower(), which is the same for ASCII; renaming one folds it fully.
ALTER TABLE sessions ADD COLUMN title_folded text NOT NULL DEFAULT '';
UPDATE sessions SET title_folded = lower(title);
