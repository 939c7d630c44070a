"""The ``perfsight`` subcommands, one module each.

Each module defines ``register(subparsers)``, which adds its parser and sets
``handler`` (a function taking the parsed arguments and returning the exit
code).  Modules import their heavy dependencies inside the handler, so
``perfsight --help`` stays fast.
"""
