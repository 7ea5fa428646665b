"""Load generators and reports: `omnivoice bench` measures a running server from the client side."""
