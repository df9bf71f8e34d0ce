"""Machines: hardware profiles (YAML, pydantic-validated) and the binding that answers, for a group of
ranks doing a collective, which link it waits on with what alpha, B, overlap and compute rate."""
