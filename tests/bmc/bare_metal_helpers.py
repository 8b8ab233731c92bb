"""Helpers for the bare-metal rental tests: a node dedicated to a tenant (with its BMC's
address and credentials when an emulator stands for it), a catalogue image, a rental."""

from gpucap.bmc import bare_metal, bare_metal_images
from gpucap.bmc.models import BareMetalImage, BareMetalRental
from gpucap.bmc.services import bmc_credential_set
from gpucap.fleet import services as fleet
from gpucap.fleet.models import Cluster, Node
from gpucap.notices import dedications
from gpucap.tenancy.models import Tenant

ISO = "https://images.example/ubuntu-24.04-live-server-amd64.iso"


def dedicated(node: Node, tenant: Tenant, *, bmc=None, operator=None) -> Node:
    """``node`` dedicated to ``tenant``; with ``bmc`` (an emulator), its BMC's address and
    credentials set."""
    dedications.node_dedicate(node=node, tenant=tenant, actor=operator)
    if bmc is not None:
        node = fleet.node_update(node=node, bmc_address=bmc.url)
        bmc_credential_set(node=node, username=bmc.username, password=bmc.password)
    return Node.objects.get(pk=node.pk)


def catalogue_image(cluster: Cluster, name: str = "ubuntu-24.04-server", **fields):
    return bare_metal_images.bare_metal_image_create(
        cluster=cluster, name=name, image_url=fields.pop("image_url", ISO), **fields
    )


def rent(node: Node, tenant: Tenant, *, image: BareMetalImage | None = None, actor=None, now=None):
    return bare_metal.bare_metal_rent(node=node, tenant=tenant, image=image, actor=actor, now=now)


def rental_of(rental: BareMetalRental) -> BareMetalRental:
    return BareMetalRental.objects.select_related("node", "tenant").get(pk=rental.pk)
