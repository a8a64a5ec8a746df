"""``lmi package`` and ``lmi inspect``: the reproducible artifact, its inspection and safe unpacking."""
