"""Celery tasks of bare-metal rentals: ids in, load, call ``gpucap.bmc.bare_metal_power``. Each
is idempotent: the power is asked of the BMC once per action whatever delivers the message
twice (a conditional claim), and a read only records what the BMC says.

- ``bmc.bare_metal_power``: sent when a tenant asks for power on, off or reset;
- ``bmc.bare_metal_power_read``: sent when a machine is rented, and after the BMC accepted an
  action, again every ``POWER_READ_INTERVAL_SECONDS`` until the power is what was asked for.
"""

from celery import shared_task

from gpucap.bmc import bare_metal_power
from gpucap.celery import app


@shared_task(name="bmc.bare_metal_power")
def power(action_id: int) -> None:
    bare_metal_power.power_send(action_id=action_id)


@shared_task(name="bmc.bare_metal_power_read")
def power_read(rental_id: int, action_id: int | None = None) -> bool:
    """Returns whether another read was sent."""
    again = bare_metal_power.power_read(rental_id=rental_id, action_id=action_id)
    if again:
        app.send_task(
            "bmc.bare_metal_power_read",
            args=[rental_id, action_id],
            countdown=bare_metal_power.POWER_READ_INTERVAL_SECONDS,
        )
    return again
