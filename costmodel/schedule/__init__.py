"""Sequences over ranks: layouts as data (which positions a rank holds, how heads split), the tile-level
ring schedule simulator, and the wall time of a ring from its per-step work. No torch, no profiles."""
