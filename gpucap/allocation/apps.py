from django.apps import AppConfig


class AllocationConfig(AppConfig):
    name = "gpucap.allocation"
    verbose_name = "Tenant allocation"

    def ready(self) -> None:
        from gpucap.allocation.fleet_section import QUOTAS
        from gpucap.allocation.reservation_fleet_section import RESERVATIONS
        from gpucap.fleet.fleetfile.sections import file_section_add

        # The tenants' quotas and reservations are part of the fleet file, which sits below
        # this app.
        file_section_add(QUOTAS)
        file_section_add(RESERVATIONS)
