"""The live path to the page: the per-turn emitter, replay buffers, the channel layer
and its Redis batching, session events."""
