"""The model side: ModelSpec (what the user names) and OpGraph (the IR every estimator reads)."""
