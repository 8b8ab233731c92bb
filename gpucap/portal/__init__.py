"""The pages that combine the apps around a tenant: where people land, the tenant portal and
the operators' list of tenants. Above the apps it reads; no app imports it."""
