"""The terminal: events rendered with rich, progress bars, findings tables. Shared by the commands and chat."""
