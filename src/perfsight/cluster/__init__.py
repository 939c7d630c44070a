"""Cluster analysis: many ranks of one job, analysed as a whole.

Read in this order: ``discovery`` (which inputs form the job), ``rank`` (the per-rank step: read one
rank and keep only what the cross-rank step needs), ``matching`` (the same op instance on every rank
of its group), ``alignment`` (one clock for all ranks), ``matrix`` (who sent how much to whom),
``parallel`` (which parallel modes the job used, and their groups), ``step_trace`` (the cluster
step trace of every parallel mode), ``slow`` (slow rank, slow link, imbalance), ``summary`` (what
``perfsight analyse`` prints) and ``job`` (the order of work).
Definitions live in docs/CLUSTER.md.
"""
