"""What every page shares and no domain app owns: who may open a page and whether it answers
with the whole page or a fragment (`pages`), and how a form shows a service's errors (`forms`).
Their templates are in `templates/components/`."""
