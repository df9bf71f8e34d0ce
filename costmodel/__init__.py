"""cp-plan: should this sequence be split over N devices, and how?

``from costmodel.symbolic import formulas`` gives the symbolic model (imports sympy); the CLI and reports use
the generated :mod:`costmodel.symbolic.numeric` so they start without it. Nothing here imports torch.
"""

__version__ = "0.2.0.dev0"

# The house's layers, lowest first. A package imports its own modules and packages of strictly lower
# layers, never one of its own layer or above (tests/test_architecture.py checks every import, lazy ones
# included; docs/architecture.md draws this table).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("symbolic", "schedule"),
    ("machines", "frameworks"),  # the hardware and the training framework a job runs on
    ("plans",),
    ("training",),
    ("inference",),  # serving reuses the training step's kernel rates and placement
    ("calibration",),  # compares measurements with inference's and the plans' predictions
    ("audit",),  # reads nccl-tests into calibration's fitted profiles
    ("cli",),
    ("codegen",),  # prints real CLI output into the docs
)
# The torch reference kernel stands beside the model, not in it: it imports only these, and only the CLI
# imports it, so no model layer ever loads torch.
KERNEL_IMPORTS = ("core", "schedule")
