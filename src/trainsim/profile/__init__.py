"""Microbenchmarks on the local device and the profile database that keeps them.

profile_job() measures every unique op of one job's OpGraph (ops.py) and, on request, collectives between local
processes (collectives.py), writing each measurement to the SQLite database (database.py) as it is taken.
`trainsim profile` (cli/profile.py) is its command line; cost/profiled.py reads the database back.

Importing this package does not import torch; the measuring functions do.
"""
