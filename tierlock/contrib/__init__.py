"""Integrations with web frameworks: ``tierlock.contrib.django`` and
``tierlock.contrib.flask``. Importing one never connects to a database."""
