"""sleuth agent: planner loop, planners, transcripts and the command line."""

__version__ = "0.1.0"
