"""The GPU kernels' checks for CPU tests: a runner of check modules under Triton's interpreter, and the
residual-code kernel's check. (The code predictor's kernel check is `omnivoice.bench.kernel_check`: a
benchmark uses it too.)"""
