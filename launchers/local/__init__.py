"""The local launcher (``launcher``: compile, submit, job management) and its run records (``jobs``)."""
