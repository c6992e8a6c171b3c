"""Why a job died or hung: the record of each failure, its classification, stack dumps and phases.

Light (no torch, ray): the driver writes records with it, ``status`` and ``why`` read them, and the
trainer ranks take their collective timeout from :mod:`slime.diagnosis.phases`.
"""
