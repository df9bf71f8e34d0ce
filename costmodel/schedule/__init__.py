"""Sequences over ranks: layouts as data (which positions a rank holds, how heads split), the ring schedule
(the pairs each rank sees at each step, in closed form, and the tile-level simulator the utilisation reads),
and the wall time of a ring from its per-step work. No torch, no profiles."""
