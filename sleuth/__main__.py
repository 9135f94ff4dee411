from sleuth.agent.cli import entrypoint

entrypoint()
