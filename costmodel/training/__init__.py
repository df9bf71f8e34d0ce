"""A training job around the attention layer: the memory fit, the recommended CP degree, sweeps over
S x N x machines, and the capacity-plan checks CI gates on."""
