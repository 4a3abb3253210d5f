"""The cropi influence service: a FastAPI app over the cropi library and its persistent job runner.

In floors, each importing only from the floors below it and from cropi (never the other way:
tests/test_service_structure.py walks every import, type-only ones included):

- ``base/``     settings, errors, SQLite connections, path confinement, log setup
- ``options/``  what a caller may choose, derived from the library's options models (``derive``,
                ``caller``), the POST bodies that start work, and job parameters -> library requests
- ``jobs/``     the durable job runner: SQLite job table, runner loop, worker processes and the
                built-in job kinds (the only modules that import torch)
- ``domain/``   what the endpoints do: registry, the torch-free library adapter, cached views of
                rankings and gradients, the ``Service`` itself
- ``api/``      the HTTP edge: app factory, routes, middleware (the hot reads), metrics, responses
- ``entry/``    ``cropi serve`` / ``cropi worker`` / ``python -m cropi_service``: the command line
"""
