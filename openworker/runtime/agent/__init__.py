"""The agent: one turn's loop (`engine`), what it sends (`history`, `compaction`,
`degradation`), its tools and titles, and the provider router for the session's owner
(`llm`)."""
