from agent.cli import entrypoint

entrypoint()
