"""``python -m costmodel.kernel selftest ...``: the kernel's commands without the main CLI, e.g. under
``torchrun -m costmodel.kernel selftest`` on a cluster."""

from costmodel.cli.kernel import app

if __name__ == "__main__":
    app(prog_name="cp-plan kernel")
