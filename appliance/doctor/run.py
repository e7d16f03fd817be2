"""``rackboot doctor``, the shell: ask the node for its status, collect every plugin's
checks (``rackboot_doctor_checks``), run them, report. A check that raises is a FAIL
naming it (a bug), never the end of the report."""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable
from typing import Any

from appliance import control
from appliance.doctor.findings import (
    DoctorCheck,
    DoctorContext,
    DoctorOptions,
    Finding,
    exit_code,
    failed,
    skipped,
)
from appliance.doctor.report import as_json, render_text
from appliance.errors import Unreachable
from appliance.logs import get_logger
from appliance.pluginmanager import call_each

log = get_logger("doctor")
STATUS_TIMEOUT = 10.0


def collect(pm: Any, options: DoctorOptions) -> tuple[list[DoctorCheck], list[Finding]]:
    """Every plugin's checks, the core's first; findings for hooks that raised and for
    options no check answers."""
    broken: list[Finding] = []

    def refused(exc: Exception) -> None:
        broken.append(failed(
            "doctor", f"a plugin's checks could not be collected: {exc}",
            "the checks of that plugin did not run", "report it to the plugin's authors",
        ))  # fmt: skip

    found = call_each(pm, "rackboot_doctor_checks", on_error=refused, options=options)
    found.sort(key=lambda item: (item[0] != "core", item[0]))
    checks = [check for _, listed in found for check in listed or ()]
    answered = {check.option for check in checks}
    for option, value in options.requested().items():
        if option not in answered:
            flag = "--" + option.replace("_", "-")
            broken.append(failed(
                option.replace("_", "-"), f"{flag} {value}: no loaded plugin runs it",
                "the plugin that does (dhcp) is disabled or not installed",
                "enable it ([plugins] disabled, --disable-plugin) or install it",
            ))  # fmt: skip
    return checks, broken


def run_checks(ctx: DoctorContext, checks: Iterable[DoctorCheck]) -> list[Finding]:
    findings: list[Finding] = []
    for check in checks:
        if check.needs_node and ctx.status is None:
            findings.append(skipped(check.name, "no node answers"))
            continue
        try:
            findings.extend(check.run(ctx))
        except Exception as exc:  # a bug in one check: say so, run the others
            log.debug("doctor check failed", check=check.name, traceback=traceback.format_exc())
            findings.append(failed(
                check.name, f"the check itself failed: {type(exc).__name__}: {exc}",
                "a bug in this check: its verdict is unknown",
                "report it (--log-level debug shows where)",
            ))  # fmt: skip
    return findings


def doctor(config: Any, pm: Any, socket_path: str, options: DoctorOptions, *,
           json_output: bool = False, verbose: bool = False) -> int:  # fmt: skip
    status, unreachable = None, ""
    try:
        status = control.call(socket_path, "status", timeout=STATUS_TIMEOUT)
    except Unreachable as exc:
        unreachable = str(exc)
    ctx = DoctorContext(
        config, options, time.time(), status, unreachable,
        call=lambda cmd, args: control.call(socket_path, cmd, args),
    )  # fmt: skip
    checks, findings = collect(pm, options)
    findings = run_checks(ctx, checks) + findings
    code = exit_code(findings, status is not None)
    if json_output:
        core = ctx.section("core")
        about = {"node": core.get("name"), "rack": core.get("rack"), "role": core.get("role"),
                 "socket": socket_path}  # fmt: skip
        print(control.dumps(as_json(findings, code, about), indent=2))
    else:
        print(render_text(findings, verbose))
    return code
