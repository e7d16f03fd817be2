"""``rackboot doctor``: checks of a running appliance and its network (docs/cli.md, "Doctor").

Every check is a small function that judges facts (the node's status, the
kernel's socket table, the clock's sync state, offers heard on a link) and
returns :class:`~appliance.doctor.findings.Finding` lines: PASS, WARN or FAIL,
with the reason and what to do. The verdicts are pure (sans-IO); gathering the
facts is the shell's part (:mod:`appliance.doctor.run`). Plugins add checks
through the ``rackboot_doctor_checks`` hook.
"""
