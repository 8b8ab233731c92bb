from django.apps import AppConfig


class RentalsConfig(AppConfig):
    name = "gpucap.rentals"
    verbose_name = "Rentals"
