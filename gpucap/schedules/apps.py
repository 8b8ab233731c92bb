from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    name = "gpucap.schedules"
    verbose_name = "Scheduled policies"

    def ready(self) -> None:
        from gpucap.fleet.fleetfile.sections import set_section_add
        from gpucap.schedules.fleet_section import SCHEDULES

        # A set's schedule is part of the fleet file, which sits below this app.
        set_section_add(SCHEDULES)
