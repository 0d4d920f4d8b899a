"""Front-ends turn a model description into the OpGraph IR: catalog/ (analytic builders), torch/, jax/ and
trace/, one registry (registry.py: FRONTENDS, ModelSource) that predict, search, validate and graph use."""
