"""Model directories the tools build: the tiny random-weight model and config.json shapes."""
