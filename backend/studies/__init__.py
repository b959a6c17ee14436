"""Studies: arms × seeds of ordinary runs, an objective per run, and a verdict with its uncertainty.

``stats`` is the pure statistics (numpy + scipy, no database); ``spec`` the study file and its
validation; ``service`` creates studies, releases their pending runs and reads them back.
"""
