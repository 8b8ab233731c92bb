"""Virtual media through the BMC (docs/bmc.md, "Provisioning by virtual media"): put an image
in the machine's virtual CD/DVD drive, take it out, read what is in it, and make the next boot,
once, from that drive. Plain Python like the rest of the client (``gpucap.bmc.redfish``).

The drive is the Manager's CD/DVD ``VirtualMedia`` (Redfish until 2021.1 kept virtual media on
the Manager); a BMC whose managers list none, as newer ones may, is asked for the system's own
``VirtualMedia`` collection. Each call is harmless to repeat: inserting the image the drive
holds already, or ejecting an empty drive, asks the BMC for nothing.
"""

import contextlib
from dataclasses import dataclass

import sushy
from sushy import BootSource, BootSourceOverrideEnabled, VirtualMediaType
from sushy import exceptions as sushy_errors

from gpucap.bmc.redfish import INVENTORY, BmcError, BmcTarget, bmc_call, bmc_session, system_of

_OPTICAL = {VirtualMediaType.CD, VirtualMediaType.DVD}


@dataclass(frozen=True)
class MediaState:
    """What the BMC says its CD/DVD drive holds. ``image`` is the URL ("" when empty)."""

    drive: str  # the VirtualMedia's Redfish id, e.g. "Cd"
    image: str
    inserted: bool
    write_protected: bool


@dataclass(frozen=True)
class BootOverride:
    """The system's boot override: ``target`` "Cd", "Pxe", "Hdd", "None"...; ``enabled``
    "Once", "Continuous" or "Disabled" ("" when the BMC does not say)."""

    target: str
    enabled: str


def virtual_media_insert(target: BmcTarget, url: str) -> MediaState:
    """Put the image at ``url`` in the CD/DVD drive, write-protected. A drive holding another
    image is emptied first; one holding this image already is left as it is."""
    with bmc_session(target) as root:
        drive = _cd_drive(root, target)
        if drive.inserted and drive.image == url:
            return _state(drive)
        if drive.inserted:
            bmc_call(target, drive.eject_media, action="VirtualMedia.EjectMedia")
        bmc_call(
            target,
            lambda: drive.insert_media(url, inserted=True, write_protected=True),
            action="VirtualMedia.InsertMedia",
        )
        return _state(_reread(target, drive))


def virtual_media_eject(target: BmcTarget) -> MediaState:
    """Empty the CD/DVD drive (nothing asked of the BMC when it is empty already)."""
    with bmc_session(target) as root:
        drive = _cd_drive(root, target)
        if not drive.inserted and not drive.image:
            return _state(drive)
        bmc_call(target, drive.eject_media, action="VirtualMedia.EjectMedia")
        return _state(_reread(target, drive))


def virtual_media_read(target: BmcTarget) -> MediaState:
    with bmc_session(target) as root:
        return _state(_cd_drive(root, target))


def boot_once_from_cd(target: BmcTarget) -> None:
    """Make the system's next boot, and only that one, from the CD/DVD drive
    (``BootSourceOverrideTarget: Cd``, ``BootSourceOverrideEnabled: Once``)."""
    with bmc_session(target) as root:
        system = bmc_call(target, lambda: system_of(root, target))
        bmc_call(
            target,
            lambda: system.set_system_boot_options(
                target=BootSource.CD, enabled=BootSourceOverrideEnabled.ONCE
            ),
            action="the boot override to Cd once",
        )


def boot_override_read(target: BmcTarget) -> BootOverride:
    with bmc_session(target) as root:
        system = bmc_call(target, lambda: system_of(root, target))
        boot = system.json.get("Boot") or {}
        return BootOverride(
            target=str(boot.get("BootSourceOverrideTarget") or ""),
            enabled=str(boot.get("BootSourceOverrideEnabled") or ""),
        )


def _cd_drive(root: sushy.Sushy, target: BmcTarget):
    """The first CD/DVD VirtualMedia of the system's managers, else of the system itself."""
    system = bmc_call(target, lambda: system_of(root, target))

    def find():
        managers, collections = [], []
        with contextlib.suppress(sushy_errors.MissingAttributeError):
            managers = system.managers  # a system may link no manager
        for owner in [*managers, system]:
            # A manager or a system without virtual media links none.
            with contextlib.suppress(sushy_errors.MissingAttributeError):
                collections.append(owner.virtual_media)
        for collection in collections:
            for drive in collection.get_members():
                if _OPTICAL & set(drive.media_types):
                    return drive
        return None

    drive = bmc_call(target, find)
    if drive is None:
        raise BmcError(
            f"{target.name}: the BMC at {target.url} has no CD/DVD virtual media drive",
            kind=INVENTORY,
        )
    return drive


def _reread(target: BmcTarget, drive):
    bmc_call(target, lambda: drive.refresh(force=True))
    return drive


def _state(drive) -> MediaState:
    return MediaState(
        drive=str(drive.identity),
        image=str(drive.image or ""),
        inserted=bool(drive.inserted),
        write_protected=bool(drive.write_protected),
    )
