"""Projections of the one log onto the wire formats our users' clients speak
(docs/compat.md; the contracts are in ../shared/compat/ of the project).

Every format is a pure state machine from stored runlog events to wire items
(`base.Projection`), sharing the span bookkeeping in `spans.py`: which text,
reasoning and tool-call spans are open, so that a format can close them where
its client needs them closed and re-open them, with the same ids, at the
start of a resumed answer. Serving (HTTP routes, replay then live, cursors)
is the same for all formats and lives beside them.
"""
