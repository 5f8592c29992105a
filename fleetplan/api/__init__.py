"""The shells around the planner: the HTTP service (app.py) and the `fleetplan` command line (cli.py).

Both only decode (models.codec), call solver.plan and encode; errors are mapped once in errors.py.
"""
