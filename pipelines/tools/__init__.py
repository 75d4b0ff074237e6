"""Build tools run from a checkout or an installed env (never by a job, never on executors)."""
