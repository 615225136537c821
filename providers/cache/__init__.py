"""Per-provider prompt-caching declarations (`<provider>.json`), read by `providers.cache_spec`.

A package (not a bare folder) so the JSON ships as package data with the wheel.
"""
