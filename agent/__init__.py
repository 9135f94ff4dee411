"""sleuth's agent side: planner loop, planners, transcripts, chat, audits, reports and the command line."""
