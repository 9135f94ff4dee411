"""Recorded runs run again: rebuilding an investigation from its transcript, verifying results under a tolerance
policy, resuming after a crash and forking from a line."""
