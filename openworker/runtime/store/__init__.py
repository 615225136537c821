"""The runtime's database side: the turn state machine, leases, local cancel tokens,
and how async code calls the ORM."""
