"""Exact resume: ExactResumeHook, persistent workers, safe checkpoint
loading."""
