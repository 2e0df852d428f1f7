"""Deployment: a run's server half and client half on other machines (Flower)."""
