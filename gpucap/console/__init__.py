"""The operators' console: the pages that combine the fleet with the apps that act on it — the
fleet overview, capacity sets (the nodes with their drains, the arbiter's plan panels from
gpucap.plans), and a node with cordon, uncordon and drain. Above the apps it reads; no app
imports it."""
