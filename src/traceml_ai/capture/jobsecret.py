"""The job secret helpers of the launchers (DESIGN §1, §3.1: they reach the wire contract through
``capture``), without the capture session's samplers: ``traceml run`` needs these before it starts
the training, and :mod:`traceml_ai.capture.session` imports psutil and the transport client (about
0.1 s; issue 14, item 1).
"""

from __future__ import annotations

from traceml_ai.telemetry import jobsecret

ENV_JOB_SECRET = jobsecret.ENV_JOB_SECRET
"""``TRACEML_JOB_SECRET``: the environment variable that carries the job secret."""
new_job_secret = jobsecret.new_secret
"""A fresh random job secret."""
MIN_JOB_SECRET_CHARS = jobsecret.MIN_SECRET_CHARS
check_job_secret = jobsecret.check_secret
"""A job secret given by the user, checked (raises ValueError naming ``TRACEML_JOB_SECRET``)."""
