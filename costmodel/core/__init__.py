"""The ground floor: the one error type for bad input, safe file reading and atomic writing, human units,
and where the built-in data lives. Imports nothing else of cp-plan."""
