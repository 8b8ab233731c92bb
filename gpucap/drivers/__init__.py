"""VM drivers: how gpucap tells a cluster's hypervisor to create, stop, start and destroy GPU
VMs. Called only from Celery tasks, never from a web request. See ``base`` for the interface."""
