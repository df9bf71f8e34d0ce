"""cp-plan: should this sequence be split over N devices, and how?

``from costmodel.symbolic import formulas`` gives the symbolic model (imports sympy); the CLI and reports use
the generated :mod:`costmodel.symbolic.numeric` so they start without it. Nothing here imports torch.
"""

__version__ = "0.2.0.dev0"
