"""Bare metal through the BMC (issue 20, docs/bmc.md): a node's baseboard management controller
over Redfish, for discovery, recovery, provisioning and whole-machine rentals.

``redfish`` is the client (plain Python, sushy underneath), ``inventory`` what it reads,
``power`` what it switches and ``vmedia`` the virtual CD/DVD drive and the one-time boot from it;
``passwords`` seals the credentials ``models.BmcCredential`` keeps (changed by ``services``);
``discovery`` compares what BMCs say with the fleet and applies it (``discovery_file`` reads a
YAML list of BMCs for ``manage.py bmc_discover``; ``discovery_runs`` stores a preview and
applies it, through ``tasks`` and ``api``); ``hypervisor_watch`` marks down the nodes whose
hypervisor stays silent, and recovery power-cycles them (``recovery_models``; ``recovery``
changes its state, ``power_cycle`` speaks to the BMC and runs the tick; ``recovery_selectors``
and ``recovery_api`` read and command it); ``provisioning`` boots a node from an image by
virtual media (``models.Provisioning``, stepped by ``tasks``, read by ``selectors`` and
``provisioning_api``); ``bare_metal`` rents whole machines to tenants
(``bare_metal_models``), who switch their power (``bare_metal_power``, ``bare_metal_tasks``)
and re-image them from a cluster's catalogue (``bare_metal_images``) through
``bare_metal_api`` and the portal.
"""
