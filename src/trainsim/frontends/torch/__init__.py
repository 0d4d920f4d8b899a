"""The PyTorch front-end: a model traced without weights (FakeTensorMode and a dispatch-mode op log) into an
OpGraph; frontend.py is its entry in the front-end registry. Importing it does not import torch."""
