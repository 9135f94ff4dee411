"""Sub-commands of the `sleuth` command line, one module each.

Every module exposes ``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``.
"""
