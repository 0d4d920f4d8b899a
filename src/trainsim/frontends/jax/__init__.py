"""The JAX front-end: a train step's jaxpr as an OpGraph (PredTOP's DAG); frontend.py is its entry in
the front-end registry. Importing it does not import jax."""
