"""Embedding tables of recommendation models and how they are split across ranks (Lin et al.,
"Towards Performance Modeling of Multi-GPU Training"):
tables (rows E, dim D, pooling factor L, index skew), lookup index
batches and their reuse factors (Fig. 6), synthetic table sets, sharding plans (table-, row-, column-wise,
data-parallel, table-row-wise) with their per-rank memory and collective volumes, and the six sharders of
Table III."""
