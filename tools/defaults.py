"""Defaults shared by the tools and the agent's config, defined once (this module imports nothing)."""

BUDGET = 20_000
"""Images one investigation may generate, unless told otherwise."""
ALPHA = 0.05
"""Family-wise error level of the findings, unless told otherwise."""
BASELINE_N = 1000
"""Images of the class baseline, unless told otherwise."""
FIRST_N = 100
"""Images of a measure_rate test's first look, unless told otherwise."""
MAX_CONFIRMATIONS = 10
"""Confirmation attempts one investigation may make; each is tested at ALPHA / MAX_CONFIRMATIONS."""

BUDGET_EXHAUSTED = "image budget exhausted"
"""How every refusal for want of images begins (a run whose calls all get it has spent its budget)."""
CONFIRMATION_DRAWS = 255
"""Blocks of confirmation seeds each investigation seed owns: a re-audit with the same seed confirms on the next."""
