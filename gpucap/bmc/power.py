"""A machine's power through its BMC (docs/bmc.md, Recovery): read it, and ask for a reset.
Plain Python like the rest of the client (``gpucap.bmc.redfish``)."""

from sushy import ResetType

from gpucap.bmc.redfish import REFUSED, BmcError, BmcTarget, bmc_call, bmc_session, system_of

# gpucap's words for the Redfish ComputerSystem.Reset types it uses.
RESETS = {
    "on": ResetType.ON,
    "force_off": ResetType.FORCE_OFF,
    "graceful_shutdown": ResetType.GRACEFUL_SHUTDOWN,
    "graceful_restart": ResetType.GRACEFUL_RESTART,
    "force_restart": ResetType.FORCE_RESTART,
}


def power_state_read(target: BmcTarget) -> str:
    """ "on", "off", "poweringon", "poweringoff" (the Redfish PowerState, lowercased), or ""."""
    with bmc_session(target) as root:
        system = bmc_call(target, lambda: system_of(root, target))
        return str(system.json.get("PowerState") or "").lower()


def system_reset(target: BmcTarget, reset: str) -> None:
    """Ask the BMC to reset the system (one of ``RESETS``). A reset the BMC does not offer, or
    refuses, is a ``BmcError`` of kind ``refused`` naming the node; nothing is retried here."""
    wanted = RESETS[reset]
    with bmc_session(target) as root:
        system = bmc_call(target, lambda: system_of(root, target))
        offered = bmc_call(target, system.get_allowed_reset_system_values)
        if wanted not in offered:
            names = ", ".join(sorted(kind.value for kind in offered)) or "none"
            raise BmcError(
                f"{target.name}: the BMC at {target.url} does not offer {wanted.value} "
                f"(it offers: {names})",
                kind=REFUSED,
            )
        bmc_call(target, lambda: system.reset_system(wanted), action="ComputerSystem.Reset")
