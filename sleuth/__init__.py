"""sleuth: an LLM planner audits an image classifier with generated images, captions, counterfactual edits and exact
statistics.

The import package gathers the project's folders under one name, so an installed sleuth adds no top-level package
named ``agent``, ``tools`` or ``prompts`` to site-packages: ``sleuth.agent`` (planner loop, planners, transcripts,
command line), ``sleuth.tools`` (one module per tool, backends, statistics) and ``sleuth.prompts`` (prompt texts).
"""

__version__ = "0.1.0"
