"""The chat page's files (served by ``routes/page.py``; package data, so they ship inside the wheel)."""
