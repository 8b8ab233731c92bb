"""Bare metal through the BMC (issue 20, docs/bmc.md): a node's baseboard management controller
over Redfish, for discovery, recovery, provisioning and whole-machine rentals.

``redfish`` is the client (plain Python, sushy underneath) and ``inventory`` what it reads; the
models, services and tasks that use them come next (docs/bmc.md says in what order).
"""
