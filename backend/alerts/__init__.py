"""Alerts: a rule names an event of the runs in its scope (one run, a study's runs, or every run
of its owner) and a webhook to tell (Slack-, Discord-compatible or plain JSON).

Events: ``failed``; ``finished`` (succeeded, failed or cancelled); ``stalled`` (running, no step
for ``stall_s``); ``metric`` (a point of ``metric_key`` below or above ``threshold``, or
non-finite). Each rule fires at most once per run.

Every API process runs a ``Dispatcher`` thread (``backend.main``'s lifespan) that, every
``CONSPO_ALERT_POLL_S``, finds the rules that fire (``rules.fire_due``: an insert that a unique
index makes happen once, whichever process saw it first) and sends the deliveries due
(``delivery``): each claimed by one process at a time, retried with doubling waits, marked
``failed`` after ``CONSPO_ALERT_MAX_ATTEMPTS`` calls. A process killed mid-call leaves its claim
to expire, and another process sends it again: a webhook may hear of an alert twice, never
zero times (the payload's ``id`` tells them apart).

Webhook URLs are checked twice (``webhooks``): when a rule is made (scheme, host, the operator's
allow-list, a literal address that is not public) and before every call (each address the name
resolves to). They are secrets, never shown beyond their scheme and host.
"""
