"""Analysis and reporting tools on finished runs and debates: ``udpo diagnose`` (does uncertainty predict
failure?), attack evaluations, error-detection and uncertainty scores, the per-question results of run
folders, and the HTML report. Studies (``udpo study``, ``udpo compare``) are :mod:`udpo.study`."""
