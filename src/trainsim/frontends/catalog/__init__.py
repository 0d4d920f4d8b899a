"""The catalog front-end: analytic OpGraph builders for the catalog's model kinds (transformer, CNN, DLRM),
dispatched by build.py; frontend.py is its entry in the front-end registry."""
