"""PersonDB: a synthetic employee directory served from memory (forkserve example)."""
