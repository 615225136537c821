"""How turns are driven: the commands of the web edge, the runner (Celery or embedded),
the worker's loop, and the lease watchdog."""
