"""The cropi influence service (installed as ``cropi_service``): a FastAPI app over the cropi
library and its persistent job runner.

Grouped by role:

- ``api/``     the HTTP edge: app factory, routes, middleware, metrics, request/response schemas
- ``domain/``  what the endpoints do: registry, path confinement, the read side of the store
               (torch-free cropi imports only), cached views of rankings and gradients, errors
- ``jobs/``    the durable job runner: SQLite job table, runner loop, worker processes, job
               parameters and the built-in job kinds (the only modules that import torch)
- ``entry/``   ``cropi serve`` / ``python -m services``: settings, logging, command line

Imports inside the package are relative, so it works under either name.
"""
