"""What the whole REST API shares and no domain app owns: the error shape (`errors`), the
permission classes (`permissions`), the schema class (`schema`), the base serializers and views
every app's `api.py` builds on (`base`), the id filter (`filters`), and the routes (`urls`)."""
