"""Front-ends turn a model description into the OpGraph IR."""
