"""Prompt texts shipped as package data (read with importlib.resources)."""
