"""Execution reward: everything that touches a database.

The pure parts (`extract`, `compare`, `reward`) never open a file; `sandbox` owns one read-only
connection; `executor` runs sandboxes in worker processes with a hard stop; `server`/`client` put
the executor behind HTTP for rollout fleets.
"""
