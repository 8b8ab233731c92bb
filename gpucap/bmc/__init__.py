"""Bare metal through the BMC (issue 20, docs/bmc.md): a node's baseboard management controller
over Redfish, for discovery, recovery, provisioning and whole-machine rentals.

``redfish`` is the client (plain Python, sushy underneath), ``inventory`` what it reads and
``power`` what it switches;
``passwords`` seals the credentials ``models.BmcCredential`` keeps (changed by ``services``);
``discovery`` compares what BMCs say with the fleet and applies it (``discovery_file`` reads a
YAML list of BMCs for ``manage.py bmc_discover``); ``hypervisor_watch`` marks down the nodes
whose hypervisor stays silent (``recovery_models.HypervisorProbe``). Recovery, provisioning and
bare-metal rentals come next (docs/bmc.md says in what order).
"""
