"""Planners: whatever decides the next turn (reasoning, tool calls or a final answer) behind ``agent.loop.Planner``."""
