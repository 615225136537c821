"""The turn runtime: everything that runs a turn once the web edge has recorded it.

Layers, top to bottom (held by import-linter, see pyproject.toml):
- `turns/`: the commands the web edge calls (send, stop, decide, retry), the runner that
  dispatches a turn (Celery task or embedded asyncio task) and the lease watchdog;
- `agent/`: the agent loop (`engine.run_turn`), its outbound history, compaction,
  degradation, titles, tools and the per-user provider router;
- `store/` (the turn's state machine in the database, leases, how async code reaches
  the ORM) beside `live/` (events to the page: emitter, replay buffer, channel layer,
  Redis batching). Neither imports the other.
"""
