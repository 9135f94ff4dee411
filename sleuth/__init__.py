"""sleuth: an LLM planner audits an image classifier with generated images, captions, counterfactual edits and exact
statistics.

The import package gathers the project's folders under one name, so an installed sleuth adds no top-level package
named ``agent``, ``tools`` or ``prompts`` to site-packages: ``sleuth.agent`` (planner loop, planners, transcripts,
command line), ``sleuth.tools`` (one module per tool, backends, statistics) and ``sleuth.prompts`` (prompt texts).
A wheel holds them under ``sleuth/``; in a checkout they are the folders beside ``sleuth/``, and the package's path
takes in the checkout's top folder, so ``PYTHONPATH=<checkout>`` and ``pip install -e .`` import the checkout's own.
"""

import os

__version__ = "0.1.0"

_here = os.path.dirname(os.path.abspath(__file__))
if not os.path.isdir(os.path.join(_here, "agent")):  # a checkout: agent/, tools/ and prompts/ are beside sleuth/
    __path__.append(os.path.dirname(_here))
del _here
