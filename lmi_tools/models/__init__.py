"""Model directories the tools build: the tiny random-weight model and the real model converted from GGUF."""
