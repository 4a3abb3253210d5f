"""The job functions every door shares: the CLI, jobs/, the Ray launcher and the service."""
