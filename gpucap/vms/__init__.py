"""The VM pages: the operators' list of every VM, a tenant's VMs with the request form, and one
VM's page with stop / start / terminate for its owner and reclaim-with-notice for operators.
They combine rentals (the VM and its lifecycle) with notices (a VM's open notice and its
countdown, the reclaim), so they live above both. Above the apps it reads; no app imports it."""
