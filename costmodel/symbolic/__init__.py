"""The symbolic cost model: base symbols (:mod:`.symbols`), every formula once as a sympy expression
(:mod:`.formulas`), and their generated numeric twins (:mod:`.numeric`, no sympy at run time)."""
