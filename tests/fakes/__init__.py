"""Local fakes of external services, for tests (real sockets, no mocks)."""
