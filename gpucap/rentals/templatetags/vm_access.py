"""How a tenant reaches a VM, for the pages that list or show VMs:
``{% load vm_access %}{{ vm|ssh_command }}``."""

from django import template

from gpucap.rentals.selectors import vm_ssh_command

register = template.Library()


@register.filter
def ssh_command(vm) -> str:
    """``ssh root@10.200.0.18`` while the VM runs and has an address; "" otherwise."""
    return vm_ssh_command(vm)
