"""`server.front_ends` > 1: the supervisor that owns the port, the engine core and the front-end
processes (supervisor.py), and a front-end process (process.py); what the front ends say to each other
is omnivoice.server.fleet's."""
