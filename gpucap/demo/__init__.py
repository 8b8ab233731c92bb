"""The demo `make run` opens on (`manage.py demo`): the fleet (`fleet.yaml`, a fleet file), the
demo tenants at work (`workload`) and two weeks of their past usage (`usage_history`). It sits
above the apps it fills, so no app imports it."""
